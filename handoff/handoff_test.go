package handoff

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// serve listens on a socket in a temp dir and hands each accepted
// connection to fn.
func serve(t *testing.T, fn func(*Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), SocketName)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go fn(NewConn(nc))
		}
	}()
	return path
}

// A question gets its answer; a cancel the wrapper sends at any moment
// closes Cancelled without being taken for an answer.
func TestAskAndCancel(t *testing.T) {
	path := serve(t, func(c *Conn) {
		defer c.Close()
		req, err := c.Read()
		if err != nil || req.Op != OpRegister || req.RunID != "in1" {
			c.Answer(Reply{Reason: "bad request"})
			return
		}
		c.Cancel() // before the answer: the client must still get the answer
		c.Answer(Reply{OK: true, Deadline: 1234})
		if req, err := c.Read(); err == nil && req.Op == OpEnded {
			c.Answer(Reply{OK: true})
		}
	})
	cl, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rep, err := cl.Ask(Request{Op: OpRegister, RunID: "in1", Dest: "b"}, 5*time.Second)
	if err != nil || !rep.OK || rep.Deadline != 1234 {
		t.Fatalf("register: %+v, %v; want ok with the deadline", rep, err)
	}
	select {
	case <-cl.Cancelled():
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel never arrived")
	}
	if rep, err := cl.Ask(Request{Op: OpEnded, RunID: "in1", Outcome: "cancelled"}, 5*time.Second); err != nil || !rep.OK {
		t.Errorf("ended: %+v, %v", rep, err)
	}
	select {
	case <-cl.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after the wrapper closed the connection")
	}
	if _, err := cl.Ask(Request{Op: OpRenew, RunID: "in1"}, time.Second); err == nil {
		t.Error("a question after the connection closed was answered")
	}
}

// A wrapper that does not answer (stopped, say) is an error within the
// timeout, never a wait without end.
func TestAskTimeout(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	path := serve(t, func(c *Conn) {
		defer c.Close()
		c.Read()
		<-hold
	})
	cl, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	_, err = cl.Ask(Request{Op: OpRenew, RunID: "x"}, 200*time.Millisecond)
	if err == nil || errors.Is(err, ErrClosed) || time.Since(start) > 5*time.Second {
		t.Errorf("Ask of a silent wrapper: %v after %v; want a timeout error", err, time.Since(start))
	}
}
