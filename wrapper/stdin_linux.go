package wrapper

// This file: the job's stdin as a stream the wrapper feeds (run --stdin
// pipe, Config.StdinPipe). The wrapper makes the pipe; the job's fd 0 is
// its read end; the wrapper alone holds the write end and counts every byte
// it wrote into it. Feeders (the host's `attach --stdin-from K`, relaying
// what a controller sends) connect to the control socket (handoff.OpStdin,
// the protocol in handoff/stdin.go). One feeder writes at a time; a new one
// replaces the last (whose connection may be half dead after a network
// cut). A feeder that starts at or before the count has what the job
// already has skipped; one that starts after it would leave a hole, and
// the run is cancelled with cause stdin_lost instead: a job is never fed a
// stream with a hole in it. The stream ends at the controller's EOF (the
// pipe is closed: the job reads end of file), when the job closes its end
// (EPIPE: later bytes have nowhere to go), or with the run.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// stdinFeed is the write end of the job's stdin and its count.
type stdinFeed struct {
	serving sync.Mutex // held by the feeder that writes

	mu      sync.Mutex
	w       *os.File           // nil once closed
	written int64              // bytes written into the pipe
	closed  string             // why the stream ended (handoff.Stdin*), "" while open
	cur     *handoffConn       // the feeder that writes, or nil
	want    *handoffConn       // the latest feeder to ask: it replaces cur
	lost    chan stdinLostNote // a feeder would leave a hole (buffered 1)
}

// stdinLostNote is what the intent of a stdin_lost cancel journals.
type stdinLostNote struct {
	from, written int64
	why           string
}

// newStdinPipe makes the job's stdin pipe: the read end for the job, the
// write end kept in s.stdin.
func (s *supervisor) newStdinPipe() (*os.File, error) {
	r, w, err := os.Pipe() // both close-on-exec: the job gets r as fd 0 only
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	s.stdin = &stdinFeed{w: w, lost: make(chan stdinLostNote, 1)}
	if s.ctl == nil {
		// Nothing can feed it: no stream at all is a stream with a hole.
		s.stdin.lose(stdinLostNote{why: "no control socket to feed the job's stdin through"})
	}
	return r, nil
}

// stdinLost delivers a feeder that would leave a hole; nil (never ready)
// for a run whose stdin is not fed.
func (s *supervisor) stdinLost() <-chan stdinLostNote {
	if s.stdin == nil {
		return nil
	}
	return s.stdin.lost
}

func (f *stdinFeed) lose(n stdinLostNote) {
	select {
	case f.lost <- n:
	default:
	}
}

// loseStdin records the intent to cancel for stdin_lost (journal, synced,
// then cancelling) under the run's lock, as any cancel.
func (s *supervisor) loseStdin(n stdinLostNote) string {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (stopping anyway)", err)
	} else {
		defer unlock()
	}
	s.warn("the job's stdin cannot be resumed (%s): cancelling the run", n.why)
	return s.intend("cancel_requested", statusfile.CauseStdinLost, journal.Fields{"by": "wrapper", "pid": s.self,
		"stdin_from": n.from, "stdin_written": n.written, "reason": n.why})
}

// serveStdin is one feeder: it takes over from the last, is answered with
// the count, then writes what it sends after the count into the pipe.
func (s *supervisor) serveStdin(h *handoffConn, req handoff.Request) {
	f := s.stdin
	switch {
	case f == nil:
		_ = h.c.Answer(handoff.Reply{Reason: handoff.ReasonNoStdin})
		return
	case req.From < 0:
		_ = h.c.Answer(handoff.Reply{Reason: reasonMalformed}) // it would skip bytes the job never had
		return
	}
	if !f.takeOver(h) {
		_ = h.c.Answer(handoff.Reply{Reason: handoff.ReasonReplaced})
		f.release(h)
		return
	}
	defer f.release(h)
	f.mu.Lock()
	written, closed := f.written, f.closed
	f.mu.Unlock()
	switch {
	case closed != "":
		_ = h.c.Answer(handoff.Reply{OK: true, Written: written, Closed: closed})
		return
	case req.From > written:
		_ = h.c.Answer(handoff.Reply{Reason: handoff.ReasonStdinGap, Written: written})
		f.lose(stdinLostNote{from: req.From, written: written,
			why: fmt.Sprintf("the controller can send from byte %d, the job has %d", req.From, written)})
		return
	}
	if err := h.c.Answer(handoff.Reply{OK: true, Written: written}); err != nil {
		return
	}
	skip := written - req.From
	fr := handoff.NewFrameReader(h.c.Stream())
	buf := make([]byte, 64<<10)
	for {
		n, rerr := fr.Read(buf)
		p := buf[:n]
		if skip > 0 {
			k := min(skip, int64(len(p)))
			p, skip = p[k:], skip-k
		}
		if len(p) > 0 && !s.writeStdin(h, p) {
			return
		}
		switch {
		case rerr == io.EOF:
			s.endStdin(handoff.StdinEOF)
			return
		case rerr != nil:
			return // the feeder went away (or sent garbage): another may resume
		}
	}
}

// writeStdin writes p into the pipe and counts it; false when this feeder
// should stop (replaced, or the stream ended).
func (s *supervisor) writeStdin(h *handoffConn, p []byte) bool {
	f := s.stdin
	f.mu.Lock()
	w, mine := f.w, f.cur == h && f.want == h
	f.mu.Unlock()
	if w == nil || !mine {
		return false
	}
	n, err := w.Write(p)
	f.mu.Lock()
	f.written += int64(n)
	f.mu.Unlock()
	switch {
	case err == nil:
		return true
	case errors.Is(err, syscall.EPIPE):
		s.endStdin(handoff.StdinReaderGone)
	}
	return false // replaced (the write deadline), or closed with the run
}

// endStdin closes the pipe once, journaling why and the count.
func (s *supervisor) endStdin(why string) {
	f := s.stdin
	f.mu.Lock()
	if f.closed != "" {
		f.mu.Unlock()
		return
	}
	f.closed = why
	w := f.w
	f.w = nil
	written := f.written
	f.mu.Unlock()
	if w != nil {
		w.Close()
	}
	s.journal("stdin_closed", journal.Fields{"reason": why, "written": written}, false)
}

// takeOver makes h the feeder: the last one's connection is closed and
// its write (which may wait on a job that does not read) interrupted, and
// h waits until it has let go, so the count it is answered with is final.
// false: a newer feeder asked meanwhile, and h is not needed.
func (f *stdinFeed) takeOver(h *handoffConn) bool {
	f.mu.Lock()
	f.want = h
	if old := f.cur; old != nil {
		_ = old.c.Close()
		if f.w != nil {
			_ = f.w.SetWriteDeadline(time.Unix(1, 0))
		}
	}
	f.mu.Unlock()
	f.serving.Lock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.want != h {
		return false
	}
	if f.w != nil {
		_ = f.w.SetWriteDeadline(time.Time{})
	}
	f.cur = h
	return true
}

func (f *stdinFeed) release(h *handoffConn) {
	f.mu.Lock()
	if f.cur == h {
		f.cur = nil
	}
	f.mu.Unlock()
	f.serving.Unlock()
}

// closeStdin ends the stream with the run: the write end is closed, so a
// feeder still writing returns, and none can start.
func (s *supervisor) closeStdin() {
	if s.stdin == nil {
		return
	}
	f := s.stdin
	f.mu.Lock()
	if f.w != nil {
		_ = f.w.SetWriteDeadline(time.Unix(1, 0))
	}
	if f.cur != nil {
		_ = f.cur.c.Close()
	}
	f.mu.Unlock()
	s.endStdin(handoff.StdinRunOver)
}
