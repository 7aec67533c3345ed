// Package agentrelay is a run's scoped SSH agent: a unix socket that passes
// a narrow part of the agent protocol on to the user's own agent, asks its
// owner before each request, and can be revoked at once.
//
// Guarantees:
//   - Only request-identities (11), sign-request (13) and the extension
//     session-bind@openssh.com (27) are ever written upstream, each as the
//     exact bytes the client sent; the upstream answer comes back as is, so a
//     failed session-bind stays a failure and a key with destination
//     restrictions (OpenSSH 8.9+) fails closed. Everything else (add, remove,
//     lock, unlock, smartcard, other extensions) is answered with
//     SSH_AGENT_FAILURE and never reaches the agent.
//   - Every request, allowed or not, goes to the Check before the answer, one
//     call per request: authority is decided per request, never once per
//     connection. The caller is the peer of the connection (SO_PEERCRED at
//     accept), whose start time is read again at every request, so a PID the
//     kernel has given to another process is not mistaken for it.
//   - Revoke closes the listener, removes the socket and closes every open
//     connection and its upstream connection; nothing is accepted or relayed
//     after it returns. A descriptor a process still holds (inherited, or
//     passed with SCM_RIGHTS) reads end-of-file.
//
// Not guaranteed: a signature already made, or a connection a client already
// authenticated upstream with one, is beyond the relay's reach.
//
// The frames are read with a bounded length (256 KiB, OpenSSH's own limit)
// and decoded with golang.org/x/crypto/ssh (Unmarshal) into the message
// layouts of draft-miller-ssh-agent; a key is an agent.Key and named by its
// SHA-256 fingerprint only. Neither key material, nor data to sign, nor a
// session ID is kept or passed to the Check. The library's keyring and its
// constraint handling are not used: the relay holds no keys.
package agentrelay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/internal/privsock"
	"github.com/agent-wrap/agent-wrap/proc"
)

// Message numbers of the agent protocol (draft-miller-ssh-agent, section 5.1).
const (
	msgFailure            = 5
	msgRequestIdentities  = 11
	msgSignRequest        = 13
	msgAddIdentity        = 17
	msgRemoveIdentity     = 18
	msgRemoveAll          = 19
	msgAddSmartcard       = 20
	msgRemoveSmartcard    = 21
	msgLock               = 22
	msgUnlock             = 23
	msgAddIDConstrained   = 25
	msgAddSmartcardConstr = 26
	msgExtension          = 27
)

// SessionBind is the one extension the relay passes on.
const SessionBind = "session-bind@openssh.com"

// maxMessage bounds a request and an answer, as OpenSSH's agent does.
const maxMessage = 256 * 1024

// Request names, as journaled.
const (
	ReqIdentities  = "identities"
	ReqSign        = "sign"
	ReqSessionBind = "session-bind"
)

// Reasons the relay itself gives for refusing, whatever the Check says,
// besides the callers every gateway refuses (authority.ReasonCallerGone,
// authority.ReasonOtherUser).
const (
	ReasonNotRelayed = "not_relayed" // a request type the relay never passes
	ReasonMalformed  = "malformed"   // a message that does not decode
)

// Caller is the process at the other end of a connection.
type Caller struct {
	PID   int
	UID   int
	Start uint64 // start time in clock ticks since boot, read at accept
}

// Request is one request as the relay saw it. It holds nothing secret.
type Request struct {
	// Type is the message number.
	Type byte
	// Name is ReqIdentities, ReqSign, ReqSessionBind, or the message number
	// in decimal for anything else.
	Name string
	// Key is the SHA-256 fingerprint of the key a sign request names.
	Key    string
	Caller Caller
	// Refusal is set when the relay refuses the request whatever the Check
	// answers: a type it never relays, a malformed message, a caller that
	// is gone. The Check is still called, to record it.
	Refusal string
}

// Decision is the Check's answer.
type Decision struct {
	Allow  bool
	Reason string
}

// Check decides one request and records it. It is called once per request,
// from the connection's goroutine, before anything is written upstream and
// before the client gets an answer; it must refuse a Request with a Refusal.
// Calls for different connections may run at the same time.
type Check func(Request) Decision

// Relay is a listening scoped agent.
type Relay struct {
	path     string
	upstream string
	check    Check
	ln       *net.UnixListener

	mu      sync.Mutex
	revoked bool
	conns   map[*conn]struct{}
	wg      sync.WaitGroup
}

// Listen binds the socket at path (mode 0600; its directory should be
// private), relaying to the agent at upstream, and starts serving. path
// must not exist, or be a stale socket, which is replaced.
func Listen(path, upstream string, check Check) (*Relay, error) {
	if check == nil {
		return nil, errors.New("agentrelay: no check")
	}
	ln, err := privsock.Listen(path) // Revoke removes it, and says so
	if err != nil {
		return nil, fmt.Errorf("agentrelay: %w", err)
	}
	r := &Relay{path: path, upstream: upstream, check: check, ln: ln, conns: map[*conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Path is the socket's path, the job's SSH_AUTH_SOCK.
func (r *Relay) Path() string { return r.path }

// Revoke ends the relay: the listener is closed, the socket removed and
// every open connection (and its upstream connection) closed. It does not
// wait for a request being decided; that request is refused or its answer
// finds the connection closed. Revoke may be called more than once; the
// error is the removal's.
func (r *Relay) Revoke() error {
	r.mu.Lock()
	if r.revoked {
		r.mu.Unlock()
		return nil
	}
	r.revoked = true
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()

	_ = r.ln.Close()
	err := os.Remove(r.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	for c := range conns {
		c.close()
	}
	return err
}

// Wait waits, after Revoke, for every goroutine of the relay to return: a
// request being decided when Revoke was called has then been answered (or
// found its connection closed). It returns promptly, since Revoke closed
// every descriptor those goroutines could block on, unless a Check blocks.
func (r *Relay) Wait() { r.wg.Wait() }

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		nc, err := r.ln.AcceptUnix()
		if err != nil {
			r.mu.Lock()
			done := r.revoked
			r.mu.Unlock()
			if done || errors.Is(err, net.ErrClosed) {
				return
			}
			continue // EMFILE and the like: the next accept may succeed
		}
		c := &conn{relay: r, client: nc, caller: Peer(nc)}
		r.mu.Lock()
		if r.revoked {
			r.mu.Unlock()
			nc.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.wg.Add(1)
		r.mu.Unlock()
		go c.serve()
	}
}

// Peer reads the connecting process's credentials (SO_PEERCRED: as of
// connect) and its start time. A caller whose stat cannot be read gets
// start 0, which no live process has, so each of its requests is refused.
// The wrapper's control socket judges its callers with it too.
func Peer(nc *net.UnixConn) Caller {
	var cred *unix.Ucred
	if rc, err := nc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		})
	}
	if cred == nil {
		return Caller{PID: 0, UID: -1}
	}
	c := Caller{PID: int(cred.Pid), UID: int(cred.Uid)}
	if st, err := proc.ReadStat(c.PID); err == nil && !st.Dead() {
		c.Start = st.Start
	}
	return c
}

// conn is one client connection and, once a request is relayed, its own
// connection to the upstream agent.
type conn struct {
	relay  *Relay
	client *net.UnixConn
	caller Caller

	mu       sync.Mutex
	upstream net.Conn
	closed   bool
}

func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	up := c.upstream
	c.upstream = nil
	c.mu.Unlock()
	c.client.Close()
	if up != nil {
		up.Close()
	}
}

func (c *conn) serve() {
	defer c.relay.wg.Done()
	defer func() {
		c.close()
		c.relay.mu.Lock()
		delete(c.relay.conns, c)
		c.relay.mu.Unlock()
	}()
	for {
		msg, err := readMessage(c.client)
		if err != nil {
			return // EOF, a closed connection or an oversized frame
		}
		req := c.classify(msg)
		if req.Refusal == "" {
			req.Refusal = c.recheckCaller()
		}
		d := c.relay.check(req)
		var answer []byte
		if d.Allow && req.Refusal == "" {
			answer, err = c.forward(msg)
			if err != nil {
				answer = nil
			}
		}
		if answer == nil {
			answer = []byte{msgFailure}
		}
		if err := writeMessage(c.client, answer); err != nil {
			return
		}
	}
}

// recheckCaller returns a refusal unless the connecting process is still
// the one that connected (same start time, not a zombie) and this user.
func (c *conn) recheckCaller() string {
	if c.caller.UID != os.Geteuid() {
		return authority.ReasonOtherUser
	}
	// A caller whose start could not be read at connect time (0) is not
	// one process: proc.Alive would take any process at its PID for it.
	if c.caller.Start == 0 || !proc.Alive(c.caller.PID, c.caller.Start) {
		return authority.ReasonCallerGone
	}
	return ""
}

// Message layouts (draft-miller-ssh-agent 3.6 and 3.8), decoded with
// ssh.Unmarshal as x/crypto/ssh/agent's own unexported types are.
type signRequestMsg struct {
	KeyBlob []byte `sshtype:"13"`
	Data    []byte
	Flags   uint32
}

type extensionMsg struct {
	ExtensionType string `sshtype:"27"`
	Contents      []byte `ssh:"rest"`
}

// classify names a request and decides whether the relay may pass it at
// all. It keeps nothing of the message but the type, and for a sign
// request, the key's fingerprint.
func (c *conn) classify(msg []byte) Request {
	req := Request{Type: msg[0], Caller: c.caller}
	switch msg[0] {
	case msgRequestIdentities:
		req.Name = ReqIdentities
		if len(msg) != 1 {
			req.Refusal = ReasonMalformed
		}
	case msgSignRequest:
		req.Name = ReqSign
		var m signRequestMsg
		if err := ssh.Unmarshal(msg, &m); err != nil {
			req.Refusal = ReasonMalformed
			break
		}
		req.Key = ssh.FingerprintSHA256(&agent.Key{Blob: m.KeyBlob})
	case msgExtension:
		var m extensionMsg
		if err := ssh.Unmarshal(msg, &m); err != nil {
			req.Name, req.Refusal = strconv.Itoa(int(msg[0])), ReasonMalformed
			break
		}
		if m.ExtensionType != SessionBind {
			req.Name, req.Refusal = strconv.Itoa(int(msg[0])), ReasonNotRelayed
			break
		}
		req.Name = ReqSessionBind
	default:
		req.Name, req.Refusal = strconv.Itoa(int(msg[0])), ReasonNotRelayed
	}
	return req
}

// forward writes the request upstream as it came and returns the answer as
// it came. An upstream connection that fails is dropped (the next request
// dials again) and the client gets SSH_AGENT_FAILURE.
func (c *conn) forward(msg []byte) ([]byte, error) {
	up, err := c.dial()
	if err != nil {
		return nil, err
	}
	if err := writeMessage(up, msg); err != nil {
		c.dropUpstream(up)
		return nil, err
	}
	answer, err := readMessage(up)
	if err != nil {
		c.dropUpstream(up)
		return nil, err
	}
	return answer, nil
}

func (c *conn) dial() (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, net.ErrClosed
	}
	if c.upstream != nil {
		return c.upstream, nil
	}
	if c.relay.upstream == "" {
		return nil, errors.New("agentrelay: no upstream agent")
	}
	up, err := net.Dial("unix", c.relay.upstream)
	if err != nil {
		return nil, err
	}
	c.upstream = up
	return up, nil
}

func (c *conn) dropUpstream(up net.Conn) {
	c.mu.Lock()
	if c.upstream == up {
		c.upstream = nil
	}
	c.mu.Unlock()
	up.Close()
}

// readMessage reads one length-prefixed agent message.
func readMessage(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	l := binary.BigEndian.Uint32(n[:])
	if l == 0 || l > maxMessage {
		return nil, fmt.Errorf("agentrelay: message of %d bytes", l)
	}
	msg := make([]byte, l)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// writeMessage writes one length-prefixed agent message in one write.
func writeMessage(w io.Writer, msg []byte) error {
	buf := make([]byte, 4+len(msg))
	binary.BigEndian.PutUint32(buf, uint32(len(msg)))
	copy(buf[4:], msg)
	_, err := w.Write(buf)
	return err
}
