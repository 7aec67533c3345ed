package controller

// This file: a controller started inside a run (a nested run). When
// Config.Control names the outer wrapper's control socket (the job's
// AGENT_WRAP_CONTROL), the run is a handoff of the outer run (package
// handoff): Follow registers it before the launch, and a refusal (the outer
// run is ending) ends Follow with 75 before anything reaches the host; the
// lease is capped at the outer run's time left, at the launch and at every
// renewal, each of which the outer wrapper is asked about first (a refusal,
// or a wrapper that cannot be asked, stops the renewals: the lease then
// ends the inner run no later than the outer deadline); a cancel the outer
// wrapper asks for is Cancel, the controller's own cancel path; and the
// outcome, once settled, is reported to the outer wrapper. Without
// Config.Control nothing here runs.

import (
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// exitOuterEnding is Follow's code for a nested run the outer run refused
// to take on (it is ending), as for any launch after an intent: 75.
const exitOuterEnding = exitcode.TempFail

// leaseMargin is taken off the outer run's time left when the inner lease
// is capped: the host rounds a deadline up to the whole second, and the
// launch or renewal takes a moment to reach it.
const leaseMargin = time.Second

// askTimeout bounds a question to the outer wrapper.
const askTimeout = 5 * time.Second

// nested is a run's handoff to the outer run.
type nested struct {
	c     *handoff.Client
	outer string
	want  time.Duration // the lease asked for (negative: none)

	deadline atomic.Int64 // the outer deadline as last answered (Unix s); 0: no lease
	launch   atomic.Int64 // the lease of the last launch sent, in ns
	stop     chan struct{}
	endOnce  sync.Once
}

// registerNested registers the run with the outer wrapper, when there is
// one, before anything reaches the host. refused is true (with the code
// for Follow) when the outer run does not take it on.
func (r *Run) registerNested() (code int, refused bool) {
	if r.cfg.Control == "" {
		return 0, false
	}
	outer := r.cfg.OuterRunID
	if outer == "" {
		outer = "the run it runs in"
	}
	c, err := handoff.Dial(r.cfg.Control)
	if err != nil {
		return r.refuseNested(outer, fmt.Sprintf("cannot reach its wrapper at %s (%v); it has ended, or is ending", r.cfg.Control, err)), true
	}
	req := handoff.Request{Op: handoff.OpRegister, RunID: r.cfg.ID, Outer: r.cfg.OuterRunID, Dest: r.cfg.Dest, PID: os.Getpid()}
	if st, err := proc.ReadStat(os.Getpid()); err == nil {
		req.Start = st.Start
	}
	if r.cfg.Lease > 0 {
		req.LeaseSeconds = r.cfg.Lease.Seconds()
	}
	rep, err := c.Ask(req, askTimeout)
	switch {
	case err != nil:
		c.Close()
		return r.refuseNested(outer, err.Error()), true
	case !rep.OK:
		c.Close()
		return r.refuseNested(outer, "it refused the registration ("+rep.Reason+")"), true
	}
	n := &nested{c: c, outer: outer, want: r.cfg.Lease, stop: make(chan struct{})}
	n.deadline.Store(rep.Deadline)
	r.nest = n
	if rep.Deadline > 0 {
		capped, ok := n.capLease()
		if !ok {
			n.end(handoff.Request{Op: handoff.OpEnded, RunID: r.cfg.ID, Outcome: ledger.NotStarted})
			return r.refuseNested(outer, "it has less than "+(2*leaseMargin).String()+" left"), true
		}
		if r.cfg.Lease < 0 || capped < r.cfg.Lease {
			r.cfg.Lease = capped
			if r.cfg.RenewEvery <= 0 || r.cfg.RenewEvery > capped/3 {
				r.cfg.RenewEvery = capped / 3
			}
			r.update(func(l *ledger.Record) { l.Lease = capped.Seconds() })
		}
	}
	go n.follow(r)
	return 0, false
}

// refuseNested settles a run the outer run did not take on: not started.
func (r *Run) refuseNested(outer, why string) int {
	reason := fmt.Sprintf("not started: the outer run %s did not take it on: %s", outer, why)
	r.settle(ledger.NotStarted, -1, "", reason)
	r.cfg.Notice(fmt.Sprintf("run %s: %s", r.cfg.ID, reason))
	r.cfg.Notice("hint: a run started inside another run ends with it; start it once the outer run is live, or outside any run")
	return exitOuterEnding
}

// capLease is the lease the inner run may have now: the lease asked for,
// at most the outer run's time left less leaseMargin. ok is false when
// that leaves less than leaseMargin.
func (n *nested) capLease() (time.Duration, bool) {
	dl := n.deadline.Load()
	if dl == 0 {
		return n.want, true
	}
	left := time.Until(time.Unix(dl, 0)) - leaseMargin
	if left < leaseMargin {
		return 0, false
	}
	if n.want > 0 && n.want < left {
		return n.want, true
	}
	return left.Truncate(time.Millisecond), true
}

// follow forwards the outer wrapper's cancel to Cancel, reports the
// launch's lease end once the host has the run, and renews at once when
// the outer deadline moves closer (the renewal caps the lease anew).
func (n *nested) follow(r *Run) {
	launched := r.launched
	for {
		select {
		case <-launched:
			launched = nil
			n.tellLeased(r, time.Duration(n.launch.Load()))
		case dl := <-n.c.Moved():
			n.deadline.Store(dl)
			select {
			case r.renewNow <- struct{}{}:
			default:
			}
		case <-n.c.Cancelled():
			r.Cancel()
			return
		case <-n.stop:
			return
		}
	}
}

// tellLeased tells the outer wrapper when the inner lease ends at the
// latest: lease after now, rounded up as the host rounds (the host set it
// no later than now).
func (n *nested) tellLeased(r *Run, lease time.Duration) {
	if lease <= 0 {
		return
	}
	end := int64(math.Ceil(float64(time.Now().Add(lease).UnixNano()) / 1e9))
	_, _ = n.c.Ask(handoff.Request{Op: handoff.OpLeased, RunID: r.cfg.ID, LeaseEnd: end}, askTimeout)
}

// nestedLaunchLease is the lease for a launch sent now ("" outside a run:
// the caller's own). It is kept, for the lease end told afterwards.
func (r *Run) nestedLaunchLease() string {
	n := r.nest
	if n == nil || r.cfg.Lease <= 0 {
		return ""
	}
	l, ok := n.capLease()
	if !ok {
		l = leaseMargin // the outer run is about to end, and its stop ends this one
	}
	if l < leaseMargin {
		l = leaseMargin
	}
	n.launch.Store(int64(l))
	return l.String()
}

// nestedRenewal asks the outer wrapper before a renewal. It returns the
// lease to renew with (0 outside a run: the run's own) and whether to renew
// at all, with the refusal in words.
func (r *Run) nestedRenewal() (time.Duration, bool, string) {
	n := r.nest
	if n == nil {
		return 0, true, ""
	}
	lease, ok := n.capLease()
	if !ok {
		return 0, false, fmt.Sprintf("the outer run %s has less than %v left", n.outer, 2*leaseMargin)
	}
	// The bound holds even if the renewal reaches the host and its answer
	// is lost: the call is cut after RenewEvery.
	end := int64(math.Ceil(float64(time.Now().Add(r.cfg.RenewEvery+lease).UnixNano()) / 1e9))
	rep, err := n.c.Ask(handoff.Request{Op: handoff.OpRenew, RunID: r.cfg.ID, LeaseSeconds: lease.Seconds(), LeaseEnd: end}, askTimeout)
	switch {
	case err != nil:
		return 0, false, fmt.Sprintf("the outer run %s cannot be asked: %v", n.outer, err)
	case !rep.OK:
		return 0, false, fmt.Sprintf("the outer run %s refused (%s)", n.outer, rep.Reason)
	}
	n.deadline.Store(rep.Deadline)
	if l, ok := n.capLease(); ok && l < lease {
		lease = l // the outer deadline moved closer
	}
	return lease, true, ""
}

// nestedRenewed tells the outer wrapper the lease end a renewal set.
func (r *Run) nestedRenewed(lease time.Duration) {
	if r.nest != nil {
		r.nest.tellLeased(r, lease)
	}
}

// endNested reports the settled outcome to the outer wrapper and closes
// the connection. A run left unsettled (the outcome could not be learned)
// is reported unknown.
func (r *Run) endNested() {
	n := r.nest
	if n == nil {
		return
	}
	rec := r.Record()
	req := handoff.Request{Op: handoff.OpEnded, RunID: r.cfg.ID, Outcome: ledger.Unknown, Reason: rec.Reason}
	if rec.State == ledger.Settled {
		req.Outcome, req.ExitCode, req.Cause = rec.Outcome, rec.ExitCode, rec.Cause
	}
	n.end(req)
}

func (n *nested) end(req handoff.Request) {
	n.endOnce.Do(func() {
		close(n.stop)
		_, _ = n.c.Ask(req, askTimeout)
		n.c.Close()
	})
}
