package relay

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string, within time.Duration) error {
	t.Helper()
	c.SetDeadline(time.Now().Add(within))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err == nil && got != msg+"\n" {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	return err
}

// dial connects to addr and checks one round trip of msg through it; what
// names the connection in a failure. The connection is closed at cleanup.
func dial(t *testing.T, addr, msg, what string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	if err := roundTrip(t, c, r, msg, 10*time.Second); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c, r
}

// silent fails unless msg sent on c gets no answer within 300 ms (a
// timeout, the connection still open); what names the relay's state.
func silent(t *testing.T, c net.Conn, r *bufio.Reader, msg, what string) {
	t.Helper()
	err := roundTrip(t, c, r, msg, 300*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("%s: %v, want a timeout", what, err)
	}
}

// ended fails unless a read on c fails within 10 s: the relay ended the
// connection; by names what did.
func ended(t *testing.T, c net.Conn, r *bufio.Reader, by string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read after %s succeeded", by)
	}
}

func TestRelayCutAndBlackhole(t *testing.T) {
	rl := Start(t, echo(t))
	c, r := dial(t, rl.Addr(), "one", "through the relay")

	// Blackholed: nothing comes back, nothing is closed.
	rl.Blackhole(true)
	silent(t, c, r, "two", "blackholed")
	// Healed: the held bytes flow on.
	rl.Blackhole(false)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}

	// Cut: the connection ends; a new one works.
	rl.Cut()
	ended(t, c, r, "Cut")
	dial(t, rl.Addr(), "three", "a new connection after Cut")
}

func TestRelayHold(t *testing.T) {
	rl := Start(t, echo(t))
	c, r := dial(t, rl.Addr(), "one", "through the relay")
	// Held: the open connection goes silent, a new one is relayed.
	rl.Hold()
	silent(t, c, r, "two", "held")
	dial(t, rl.Addr(), "three", "a new connection while one is held")
	// Cut ends the held one.
	rl.Cut()
	ended(t, c, r, "Cut")
}

// TestListenClose: a relay made with Listen (no test to clean up after it)
// relays until Close, which ends the connections open then, a blackholed
// one included, and stops accepting new ones.
func TestListenClose(t *testing.T) {
	rl, err := Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			rl.Close()
		}
	})
	c, r := dial(t, rl.Addr(), "one", "through the relay")
	rl.Blackhole(true)
	rl.Close()
	closed = true
	ended(t, c, r, "Close")
	if c2, err := net.DialTimeout("tcp", rl.Addr(), 10*time.Second); err == nil {
		c2.Close()
		t.Fatal("a new connection after Close was accepted")
	}
}
