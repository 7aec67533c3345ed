// Package handoff is the protocol between a run's wrapper and an
// `agent-wrap ssh` started inside that run: the inner controller registers
// the run it starts on another host (a handoff), asks before each lease
// renewal how long the outer run has left, tells how its lease stands and
// how the inner run ended; the wrapper asks it to cancel when the outer run
// is ending.
//
// The wrapper listens on a unix socket of the run's own (SocketName in the
// run directory, or a short path in a private per-user directory), named in
// the job's environment as EnvControl. The protocol is JSON, one object per
// line, on one connection per handoff that the inner controller holds open
// for the life of its run: every Request gets one Reply, in order; the
// wrapper may also send a Reply with Op "cancel" at any time, which asks the
// inner controller to cancel its run (its own cancel path: ledger
// cancel_requested, then `cancel --wait` over a new connection), or with Op
// "deadline" when the outer deadline has moved closer.
//
// Guarantees, for the wrapper's side (wrapper/handoff_linux.go): a
// registration is answered OK only after the `handoff` event is synced to
// the outer journal, and only while the outer run is running with no intent
// on record and the caller is a process of the run (SO_PEERCRED and its
// start time, the same check as the run's agent relay); every later renewal
// question is decided the same way. The client here guarantees nothing
// about the outer run: it reports what the wrapper answered, and an error
// when the wrapper cannot be asked (which the controller takes as a
// refusal).
package handoff

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// EnvControl names the wrapper's control socket in a job's environment.
const EnvControl = "AGENT_WRAP_CONTROL"

// EnvRunID is the outer run's ID in a job's environment (the wrapper sets
// it for every job).
const EnvRunID = "AGENT_WRAP_RUN_ID"

// SocketName is the control socket's name in a run directory.
const SocketName = "control.sock"

// Request operations (inner controller to wrapper).
const (
	OpRegister = "register" // before the launch: may this run start, and how long is left?
	OpRenew    = "renew"    // before each renewal: may the lease be renewed, and for how long?
	OpLeased   = "leased"   // the inner run's lease ends by LeaseEnd (host clock rounded up)
	OpEnded    = "ended"    // the inner run's outcome, as the controller settled it
)

// The wrapper's unsolicited messages: cancel the inner run; the outer
// deadline moved closer (Reply.Deadline), so renew at once with the new cap.
const (
	OpCancel   = "cancel"
	OpDeadline = "deadline"
)

// opReply marks a Reply that answers a Request.
const opReply = "reply"

// Request is one message from the inner controller.
type Request struct {
	Op string `json:"op"`
	// RunID is the inner run's ID (the handoff's name).
	RunID string `json:"run_id"`
	// Outer is the run the controller believes it is inside
	// (AGENT_WRAP_RUN_ID); the wrapper refuses a registration for another.
	Outer string `json:"outer_run_id,omitempty"`
	// Dest is where the inner run goes (register).
	Dest string `json:"dest,omitempty"`
	// PID and Start identify the inner controller (register); the wrapper
	// checks them against the socket's peer.
	PID   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// LeaseSeconds is the lease the controller wants (register, renew).
	LeaseSeconds float64 `json:"lease_seconds,omitempty"`
	// LeaseEnd (Unix seconds) is when the inner run's lease ends at the
	// latest, as far as the controller knows (leased, renew).
	LeaseEnd int64 `json:"lease_end_epoch,omitempty"`
	// Outcome, ExitCode, Cause and Reason are the settled outcome (ended):
	// the ledger's outcome (completed, cancelled, unknown, not_started).
	Outcome  string `json:"outcome,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Cause    string `json:"cause,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// From is the first byte of the stdin stream a feeder will send
	// (stdin.go).
	From int64 `json:"from,omitempty"`
}

// Reply is one message from the wrapper: an answer, or Op OpCancel.
type Reply struct {
	Op string `json:"op"`
	OK bool   `json:"ok"`
	// Reason is why a request was refused (the authority reasons:
	// intent_recorded, lease_expired, not_running, not_in_run, ...).
	Reason string `json:"reason,omitempty"`
	// Deadline is the outer run's deadline in Unix seconds; 0: no lease.
	Deadline int64 `json:"deadline_epoch,omitempty"`
	// Written is how many bytes of the stdin stream the job was given, and
	// Closed why the stream has ended ("" while it is open): the answer to
	// OpStdin (stdin.go).
	Written int64  `json:"written,omitempty"`
	Closed  string `json:"closed,omitempty"`
}

// ErrClosed is returned by Ask once the connection to the wrapper is gone.
var ErrClosed = errors.New("handoff: the connection to the outer run's wrapper is closed")

// Client is an inner controller's connection to the outer wrapper.
type Client struct {
	conn    net.Conn
	askMu   sync.Mutex // one question at a time
	writeMu sync.Mutex
	replies chan Reply
	moved   chan int64 // the outer deadline moved closer (latest only)
	cancel  chan struct{}
	done    chan struct{}
	once    sync.Once
}

// Dial connects to the wrapper's control socket.
func Dial(path string) (*Client, error) {
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, replies: make(chan Reply, 1), moved: make(chan int64, 1), cancel: make(chan struct{}), done: make(chan struct{})}
	go c.read()
	return c, nil
}

func (c *Client) read() {
	defer close(c.done)
	sc := bufio.NewScanner(c.conn)
	for sc.Scan() {
		var r Reply
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		switch r.Op {
		case OpCancel:
			c.once.Do(func() { close(c.cancel) })
			continue
		case OpDeadline:
			select { // keep the latest only
			case <-c.moved:
			default:
			}
			c.moved <- r.Deadline
			continue
		}
		select {
		case c.replies <- r:
		default: // an answer nobody waits for (its question timed out)
		}
	}
}

// Cancelled is closed once the wrapper has asked for the inner run to be
// cancelled.
func (c *Client) Cancelled() <-chan struct{} { return c.cancel }

// Moved delivers the outer deadline (Unix seconds) each time the wrapper
// says it moved closer; only the latest is kept.
func (c *Client) Moved() <-chan int64 { return c.moved }

// Done is closed once the connection is gone (the wrapper closed it, or
// died).
func (c *Client) Done() <-chan struct{} { return c.done }

// Ask sends req and waits up to timeout for the answer.
func (c *Client) Ask(req Request, timeout time.Duration) (Reply, error) {
	c.askMu.Lock()
	defer c.askMu.Unlock()
	// Drop a late answer to an earlier question that timed out.
	select {
	case <-c.replies:
	default:
	}
	b, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	c.writeMu.Lock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(timeout))
	_, err = c.conn.Write(append(b, '\n'))
	c.writeMu.Unlock()
	if err != nil {
		return Reply{}, fmt.Errorf("handoff: %s: %w", req.Op, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-c.replies:
		return r, nil
	case <-c.done:
		// The reader hands an answer over before it closes done, so an
		// answer followed at once by the wrapper closing the connection
		// is still the answer: both cases are ready, and select picks
		// either.
		select {
		case r := <-c.replies:
			return r, nil
		default:
		}
		return Reply{}, ErrClosed
	case <-t.C:
		return Reply{}, fmt.Errorf("handoff: %s: no answer from the outer run's wrapper within %v", req.Op, timeout)
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the wrapper's side of one connection.
type Conn struct {
	conn    net.Conn
	br      *bufio.Reader
	writeMu sync.Mutex
}

// maxLine bounds one request line.
const maxLine = 64 << 10

// NewConn wraps an accepted connection.
func NewConn(conn net.Conn) *Conn {
	return &Conn{conn: conn, br: bufio.NewReaderSize(conn, maxLine)}
}

// Read returns the next request; an error when the connection is gone or
// sent something that is not a request.
func (c *Conn) Read() (Request, error) {
	var r Request
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return r, errors.New("handoff: a request longer than 64 KiB")
		}
		if errors.Is(err, io.EOF) {
			return r, ErrClosed
		}
		return r, err
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("handoff: a message that is not a request: %v", err)
	}
	return r, nil
}

// Stream is what the connection sends after its last request line: a
// stdin feeder's frames (stdin.go).
func (c *Conn) Stream() io.Reader { return c.br }

// SetWriteDeadline bounds the wait for the connection's next write.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.conn.SetWriteDeadline(t) }

// Answer sends a reply to the last request.
func (c *Conn) Answer(r Reply) error {
	r.Op = opReply
	return c.write(r)
}

// Cancel asks the inner controller to cancel its run.
func (c *Conn) Cancel() error { return c.write(Reply{Op: OpCancel}) }

// Moved tells the inner controller the outer deadline moved closer.
func (c *Conn) Moved(deadline int64) error { return c.write(Reply{Op: OpDeadline, Deadline: deadline}) }

func (c *Conn) write(r Reply) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.conn.Write(append(b, '\n'))
	return err
}

// SetReadDeadline bounds the wait for the next request.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.conn.SetReadDeadline(t) }

// Close closes the connection.
func (c *Conn) Close() error { return c.conn.Close() }
