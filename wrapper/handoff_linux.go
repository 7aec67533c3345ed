package wrapper

// This file: handoffs, the runs that a job of this run starts on other
// hosts with `agent-wrap ssh` (package handoff). The wrapper listens on a
// control socket before the job starts (the job's AGENT_WRAP_CONTROL);
// each inner controller registers there before it launches (journal
// `handoff`, synced, then the answer with the outer deadline) and asks
// before each renewal. At the intent, before the first signal to the group,
// stopAll asks every open handoff to cancel and waits up to the handoff
// grace for its confirmation (journal `handoff_end` for each), so the
// runs a job handed on end first, innermost first, and the final record
// names each with its outcome.

import (
	"errors"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/agentrelay"
	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/internal/privsock"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// channelHandoff is the authority channel of handoff questions, as
// journaled in their `action` events.
const channelHandoff = "handoff"

// reasonMalformed refuses a registration that does not name the inner run
// and its destination.
const reasonMalformed = "malformed"

// control is the run's control socket and its handoffs.
type control struct {
	ln   *net.UnixListener
	path string

	mu      sync.Mutex
	ending  bool                      // the run is stopping: registrations are refused
	list    []*handoffConn            // registered, in order
	conns   map[*handoffConn]struct{} // every open connection
	changed chan struct{}             // the record should be rewritten (buffered 1)
	wg      sync.WaitGroup
}

// handoffConn is one registered handoff and its connection.
type handoffConn struct {
	c      *handoff.Conn
	caller agentrelay.Caller
	rec    statusfile.Handoff // guarded by control.mu
	ended  bool               // guarded by control.mu: the outcome is journaled
	done   chan struct{}      // closed when the outcome is known or the connection gone
	once   sync.Once
}

func (h *handoffConn) finish() { h.once.Do(func() { close(h.done) }) }

// startControl listens on the run's control socket. A socket that cannot
// be made is said and journaled; the job then runs without one, so an
// `agent-wrap ssh` in it registers nothing, as outside a run.
func (s *supervisor) startControl() {
	path, err := agentrelay.SocketPathNamed(s.d.Path, handoff.SocketName, os.Getenv)
	var ln *net.UnixListener
	if err == nil {
		ln, err = privsock.Listen(path)
	}
	if err != nil {
		s.warn("no control socket, so runs this job starts elsewhere are not bounded by it: %v", err)
		s.journal("control_unavailable", journal.Fields{"error": err.Error()}, false)
		return
	}
	s.ctl = &control{ln: ln, path: path, changed: make(chan struct{}, 1), conns: map[*handoffConn]struct{}{}}
	s.rec.ControlSocket = path
	s.rec.HandoffGraceSeconds = s.handoffGrace().Seconds()
	s.ctl.wg.Add(1)
	go s.acceptHandoffs()
}

// handoffGrace is how long the stop waits for the handoffs' confirmations.
func (s *supervisor) handoffGrace() time.Duration {
	switch {
	case s.cfg.HandoffGrace < 0:
		return 0
	case s.cfg.HandoffGrace == 0:
		return s.cfg.Grace
	}
	return s.cfg.HandoffGrace
}

// controlEnv is the job's AGENT_WRAP_CONTROL, or "" without a socket.
func (s *supervisor) controlEnv() string {
	if s.ctl == nil {
		return ""
	}
	return handoff.EnvControl + "=" + s.ctl.path
}

// controlChanged is the wait loop's wake-up to rewrite the record; nil
// (never ready) without a socket.
func (s *supervisor) controlChanged() <-chan struct{} {
	if s.ctl == nil {
		return nil
	}
	return s.ctl.changed
}

func (c *control) touch() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (s *supervisor) acceptHandoffs() {
	defer s.ctl.wg.Done()
	for {
		nc, err := s.ctl.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like
			continue
		}
		h := &handoffConn{c: handoff.NewConn(nc), caller: agentrelay.Peer(nc), done: make(chan struct{})}
		s.ctl.mu.Lock()
		s.ctl.conns[h] = struct{}{}
		if s.ctl.ending {
			_ = h.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // closeControl may have looked already
		}
		s.ctl.mu.Unlock()
		s.ctl.wg.Add(1)
		go func() {
			defer s.ctl.wg.Done()
			s.serveHandoff(h)
			s.ctl.mu.Lock()
			delete(s.ctl.conns, h)
			s.ctl.mu.Unlock()
		}()
	}
}

// serveHandoff answers one inner controller: its registration, then its
// questions and reports, until it closes the connection.
func (s *supervisor) serveHandoff(h *handoffConn) {
	defer h.c.Close()
	req, err := h.c.Read()
	if err != nil {
		return
	}
	if req.Op == handoff.OpStdin {
		s.serveStdin(h, req) // stdin_linux.go
		return
	}
	if req.Op != handoff.OpRegister || !s.register(h, req) {
		return
	}
	target := req.Dest + " " + req.RunID
	for {
		req, err := h.c.Read()
		if err != nil {
			s.handoffGone(h)
			return
		}
		switch req.Op {
		case handoff.OpRenew:
			dec := s.decideHandoff(h, handoff.OpRenew, target)
			if dec.Allowed() {
				s.noteLeaseEnd(h, req.LeaseEnd)
			}
			_ = h.c.Answer(handoff.Reply{OK: dec.Allowed(), Reason: dec.Reason, Deadline: dec.DeadlineEpoch})
		case handoff.OpLeased:
			s.noteLeaseEnd(h, req.LeaseEnd)
			_ = h.c.Answer(handoff.Reply{OK: true})
		case handoff.OpEnded:
			s.handoffEnded(h, req)
			_ = h.c.Answer(handoff.Reply{OK: true})
		default:
			_ = h.c.Answer(handoff.Reply{Reason: "unknown operation " + req.Op})
		}
	}
}

// register decides a registration: the caller must be the process it
// says it is, a process of this run, for this run, and the run running
// with no intent on record (authority.Gate, under the run's lock). An
// accepted one is journaled (`handoff`, synced) before the answer. The
// control's lock is held throughout, so a registration accepted before
// the intent is in the list when the stop looks.
func (s *supervisor) register(h *handoffConn, req handoff.Request) bool {
	target := req.Dest + " " + req.RunID
	refuse := func(reason string) bool {
		_ = h.c.Answer(handoff.Reply{Reason: reason})
		return false
	}
	// Refusals decided here are journaled through the gate as well, like
	// the agent relay's own.
	refuseHere := func(reason string) bool {
		s.decideHandoffRefused(h, handoff.OpRegister, target, reason)
		return refuse(reason)
	}
	switch {
	case req.RunID == "" || req.Dest == "":
		return refuseHere(reasonMalformed)
	case req.Outer != "" && req.Outer != s.cfg.ID:
		return refuseHere(authority.ReasonNotMember) // it believes it is in another run
	case req.PID != h.caller.PID || req.Start != h.caller.Start:
		return refuseHere(authority.ReasonNotMember) // it is not who it says it is
	}
	ctl := s.ctl
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	if ctl.ending {
		return refuseHere(authority.ReasonIntent)
	}
	dec := s.decideHandoff(h, handoff.OpRegister, target)
	if !dec.Allowed() {
		return refuse(dec.Reason)
	}
	h.rec = statusfile.Handoff{RunID: req.RunID, Dest: req.Dest, ControllerPID: h.caller.PID,
		ControllerStart: h.caller.Start, RegisteredAt: statusfile.Timestamp(time.Now()), Outcome: statusfile.HandoffRunning}
	if err := s.appendJournal("handoff", journal.Fields{"run_id": req.RunID, "dest": req.Dest,
		"controller_pid": h.caller.PID, "controller_start": h.caller.Start, "lease_seconds": req.LeaseSeconds}, true); err != nil {
		s.warn("cannot journal handoff %s: %v (refusing it)", req.RunID, err)
		return refuse(authority.ReasonNoJournal)
	}
	ctl.list = append(ctl.list, h)
	ctl.touch()
	// An answer that cannot be written (the controller went away) is
	// found by the read that follows: the handoff then ends unknown.
	_ = h.c.Answer(handoff.Reply{OK: true, Deadline: dec.DeadlineEpoch})
	return true
}

// decideHandoff asks the run's gate whether the inner controller may act
// (register, renew) now.
func (s *supervisor) decideHandoff(h *handoffConn, request, target string) authority.Decision {
	<-s.scope.live
	dec, err := s.scope.gate.Decide(authority.Action{Channel: channelHandoff, Request: request, Target: target,
		CallerPID: h.caller.PID, CallerStart: h.caller.Start})
	if err != nil {
		s.warn("handoff %s refused: %v", request, err)
	}
	return dec
}

// decideHandoffRefused journals a refusal decided before the gate (a
// caller that is not who it says, the stop has begun).
func (s *supervisor) decideHandoffRefused(h *handoffConn, request, target, reason string) {
	_, _ = s.scope.gate.Decide(authority.Action{Channel: channelHandoff, Request: request, Target: target,
		CallerPID: h.caller.PID, CallerStart: h.caller.Start, Refusal: reason})
}

// noteLeaseEnd records when the inner run's lease ends at the latest.
func (s *supervisor) noteLeaseEnd(h *handoffConn, epoch int64) {
	if epoch <= 0 {
		return
	}
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	h.rec.LeaseEndsAt = statusfile.Timestamp(time.Unix(epoch, 0))
	s.ctl.touch()
}

// handoffEnded records the outcome the inner controller reports. A report
// that comes after the handoff was judged unknown (late, during the group
// stop) is journaled too: the record then says what the controller said.
func (s *supervisor) handoffEnded(h *handoffConn, req handoff.Request) {
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	late := h.ended
	h.rec.Outcome, h.rec.ExitCode, h.rec.Cause = req.Outcome, req.ExitCode, req.Cause
	if h.rec.Outcome == "" {
		h.rec.Outcome = statusfile.HandoffUnknown
	}
	h.rec.Learned, h.rec.Remaining = statusfile.HandoffByController, ""
	if h.rec.Outcome == statusfile.HandoffUnknown {
		h.rec.Remaining = h.rec.RemainingWork()
	}
	s.endHandoffLocked(h, late)
}

// handoffGone is a connection closed without a report: the controller
// died or gave up. The outcome is unknown.
func (s *supervisor) handoffGone(h *handoffConn) {
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	if h.ended {
		h.finish()
		return
	}
	h.rec.Outcome, h.rec.Learned = statusfile.HandoffUnknown, statusfile.HandoffConnectionClosed
	h.rec.Remaining = h.rec.RemainingWork()
	s.endHandoffLocked(h, false)
}

// endHandoffLocked journals handoff_end (synced) with the handoff's
// outcome; the caller holds control.mu.
func (s *supervisor) endHandoffLocked(h *handoffConn, late bool) {
	h.ended = true
	h.rec.EndedAt = statusfile.Timestamp(time.Now())
	f := journal.Fields{"run_id": h.rec.RunID, "dest": h.rec.Dest, "outcome": h.rec.Outcome, "learned": h.rec.Learned}
	if h.rec.ExitCode != nil {
		f["exit_code"] = *h.rec.ExitCode
	}
	if h.rec.Cause != "" {
		f["cause"] = h.rec.Cause
	}
	if h.rec.LeaseEndsAt != "" {
		f["lease_ends_at"] = h.rec.LeaseEndsAt
	}
	if late {
		f["late"] = true
	}
	s.journal("handoff_end", f, true)
	h.finish()
	s.ctl.touch()
}

// deadlineMoved tells every open handoff that the outer deadline moved
// closer (renew --lease with a shorter lease), so each renews its own at
// once with the new cap instead of at its next renewal.
func (s *supervisor) deadlineMoved(deadline int64) {
	if s.ctl == nil {
		return
	}
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	for _, h := range s.ctl.list {
		if !h.ended {
			_ = h.c.Moved(deadline)
		}
	}
}

// endHandoffs is the stop's first step: no registration is taken any
// more; each open handoff is asked to cancel (over its connection, or with
// TERM to its verified controller when the connection fails), and the
// stop waits up to the handoff grace for their outcomes. One still open
// then is journaled unknown (unconfirmed), its lease end named. Runs only
// in the supervisor's goroutine.
func (s *supervisor) endHandoffs() {
	if s.ctl == nil {
		return
	}
	ctl := s.ctl
	ctl.mu.Lock()
	ctl.ending = true
	var open []*handoffConn
	for _, h := range ctl.list {
		if !h.ended {
			open = append(open, h)
		}
	}
	ctl.mu.Unlock()
	if len(open) == 0 {
		return
	}
	for _, h := range open {
		if err := h.c.Cancel(); err != nil {
			// The connection failed: TERM is the controller's own cancel
			// too, sent only to the process verified at registration.
			id := proc.Identity{PID: h.caller.PID, Start: h.caller.Start}
			if err := stop.Signal(id, unix.SIGTERM); err != nil && !errors.Is(err, proc.ErrGone) {
				s.warn("a handoff's controller (PID %d) cannot be asked to cancel: %v", h.caller.PID, err)
			}
		}
	}
	t := time.NewTimer(s.handoffGrace())
	defer t.Stop()
wait:
	for _, h := range open {
		select {
		case <-h.done:
		case <-t.C:
			break wait
		}
	}
	ctl.mu.Lock()
	for _, h := range open {
		if !h.ended {
			h.rec.Outcome, h.rec.Learned = statusfile.HandoffUnknown, statusfile.HandoffUnconfirmed
			h.rec.Remaining = h.rec.RemainingWork()
			s.endHandoffLocked(h, false)
		}
	}
	ctl.mu.Unlock()
	s.syncHandoffs()
	s.writeRecord(false)
}

// syncHandoffs copies the handoffs into the record; it reports whether
// they changed. Supervisor goroutine only (it writes s.rec).
func (s *supervisor) syncHandoffs() bool {
	if s.ctl == nil {
		return false
	}
	s.ctl.mu.Lock()
	list := make([]statusfile.Handoff, len(s.ctl.list))
	for i, h := range s.ctl.list {
		list[i] = h.rec
	}
	s.ctl.mu.Unlock()
	if slices.EqualFunc(list, s.rec.Handoffs, handoffEqual) {
		return false
	}
	s.rec.Handoffs = list
	return true
}

func handoffEqual(a, b statusfile.Handoff) bool {
	return a.RunID == b.RunID && a.Outcome == b.Outcome && a.LeaseEndsAt == b.LeaseEndsAt &&
		a.Learned == b.Learned && a.EndedAt == b.EndedAt
}

// recordHandoffs rewrites the live record when the handoffs changed.
func (s *supervisor) recordHandoffs() {
	if s.syncHandoffs() {
		s.writeRecord(false)
	}
}

// closeControl ends the control socket before the final record: the
// listener is closed and the socket removed, each connection gets a moment
// to deliver what its controller already sent (they are all gone by now,
// or were judged by endHandoffs), and any handoff still open is journaled
// unknown. The record then holds every handoff's last word.
func (s *supervisor) closeControl() {
	s.closeStdin() // a feeder still writing returns
	if s.ctl == nil {
		return
	}
	ctl := s.ctl
	ctl.mu.Lock()
	ctl.ending = true
	ctl.mu.Unlock()
	_ = ctl.ln.Close()
	if err := os.Remove(ctl.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.warn("cannot remove the control socket: %v", err)
	}
	ctl.mu.Lock()
	for h := range ctl.conns {
		_ = h.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	}
	ctl.mu.Unlock()
	ctl.wg.Wait()
	s.syncHandoffs()
}
