// Package relay is a TCP relay for tests that a test controls, put between
// an ssh client and sshd with `-o ProxyCommand=` (see ProxyCommand), so that
// the test can cut every connection or blackhole the traffic on demand,
// deterministically and without root.
//
// What it guarantees:
//   - It listens on 127.0.0.1 only and dials only the target given.
//   - Cut closes every connection open at the call, both sides; later
//     connections are relayed as usual.
//   - Hold blackholes the connections open at the call, as Blackhole does,
//     until Release or Cut; later connections are relayed as usual.
//   - While Blackhole(true) holds, no byte is forwarded in either direction
//     and new connections are accepted but not connected to the target:
//     to both ends the network has gone silent, nothing is closed. Bytes
//     held meanwhile flow on after Blackhole(false).
//   - t.Cleanup (Close, for Listen) closes the listener and every
//     connection.
//
// The ssh side needs a program that connects its stdin and stdout to the
// relay: the test binary (or the program) itself, re-executed (see
// Connector).
package relay

import (
	"io"
	"net"
	"os"
	"sync"
	"testing"
)

// connectFlag is the argument by which a re-executed test binary knows it
// is to act as the ProxyCommand.
const connectFlag = "-relay-connect"

// Connector turns the test binary into the ProxyCommand when it was
// started as one: it relays stdin and stdout to the address in its
// arguments and exits. Call it first thing in TestMain; it returns only
// when the binary was started as a test.
func Connector() {
	if len(os.Args) != 3 || os.Args[1] != connectFlag {
		return
	}
	c, err := net.Dial("tcp", os.Args[2])
	if err != nil {
		os.Stderr.WriteString("relay connector: " + err.Error() + "\n")
		os.Exit(255)
	}
	go func() {
		io.Copy(c, os.Stdin)
		c.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(os.Stdout, c)
	os.Exit(0)
}

// Relay forwards connections to a target.
type Relay struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	holes bool // blackholed
	conns map[net.Conn]struct{}
	held  map[net.Conn]bool // blackholed by Hold

	open, peak, total int // client connections: open now, most open at once, accepted
}

// Start listens on 127.0.0.1 and relays each connection to target; the
// test's cleanup closes it.
func Start(t testing.TB, target string) *Relay {
	t.Helper()
	r, err := Listen(target)
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// Listen is Start for a program that is not a test (the chaos campaign):
// the caller closes the relay with Close.
func Listen(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}, held: map[net.Conn]bool{}}
	r.cond = sync.NewCond(&r.mu)
	go r.serve()
	return r, nil
}

// Close stops listening and closes every connection, held ones included.
func (r *Relay) Close() {
	r.ln.Close()
	r.Blackhole(false)
	r.Cut()
}

// Connections reports the client connections the relay has seen: how many
// are open now, the most that were open at once, and how many it accepted.
func (r *Relay) Connections() (open, peak, total int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.open, r.peak, r.total
}

// counted counts client connection c open until it is closed (by either
// side, or by Cut).
func (r *Relay) counted() func() {
	r.mu.Lock()
	r.open++
	r.total++
	if r.open > r.peak {
		r.peak = r.open
	}
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.open--
			r.mu.Unlock()
		})
	}
}

// Addr is the relay's address, host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// ProxyCommand returns the ssh option value that connects through the
// relay: the test binary re-executed as Connector.
func (r *Relay) ProxyCommand() string {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exe + " " + connectFlag + " " + r.Addr()
}

// Cut closes every connection open now.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
		delete(r.conns, c)
		delete(r.held, c)
	}
	r.cond.Broadcast() // what a held connection waits for is gone
}

// Hold stops all forwarding on the connections open now (both sides of
// each), until Cut; new connections are relayed as usual.
func (r *Relay) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		r.held[c] = true
	}
}

// Release resumes forwarding on the connections Hold held; the bytes held
// meanwhile flow on.
func (r *Relay) Release() {
	r.mu.Lock()
	r.held = map[net.Conn]bool{}
	r.mu.Unlock()
	r.cond.Broadcast()
}

// Blackhole stops (on) or resumes (off) all forwarding.
func (r *Relay) Blackhole(on bool) {
	r.mu.Lock()
	r.holes = on
	r.mu.Unlock()
	r.cond.Broadcast()
}

// gate waits while the relay is blackholed, or src is held.
func (r *Relay) gate(src net.Conn) {
	r.mu.Lock()
	for r.holes || r.held[src] {
		r.cond.Wait()
	}
	r.mu.Unlock()
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.track(c)
		done := r.counted()
		go func() {
			defer done()
			r.gate(c)
			u, err := net.Dial("tcp", r.target)
			if err != nil {
				c.Close()
				return
			}
			r.track(u)
			// A connection cut while this one was being dialled.
			r.mu.Lock()
			_, live := r.conns[c]
			r.mu.Unlock()
			if !live {
				c.Close()
				u.Close()
				return
			}
			fin := make(chan struct{})
			go func() { r.pipe(u, c); close(fin) }()
			r.pipe(c, u)
			<-fin
		}()
	}
}

// pipe copies from src to dst through the gate until either side ends,
// then closes both.
func (r *Relay) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.gate(src)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
