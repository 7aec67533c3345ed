package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// gaveUp reports whether --give-up has passed since the last renewal that
// succeeded. Where there is nothing to renew (no lease, or the host refused
// a renewal because the run is ending) the output's progress and each
// successful connection count as renewals, and a run without a lease gives
// up only while detached.
func (r *Run) gaveUp() bool {
	if r.cfg.Lease < 0 {
		if p := r.now().phase; p != phaseDetached && p != phaseLaunching {
			return false
		}
	}
	return time.Since(time.Unix(0, r.lastRenew.Load())) > r.cfg.GiveUp
}

// withGiveUp returns ctx that also ends when --give-up passes, whatever
// the call's ssh still believes. It sleeps until the give-up would pass if
// nothing were renewed meanwhile, then looks: a renewal since moved the
// time on, so a run in flight wakes it about once per --give-up, not
// several times a second. Past that time without having given up (a run
// without a lease gives up only while detached or launching), it looks
// every giveUpLook.
func (r *Run) withGiveUp(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTimer(r.untilGiveUp())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if r.gaveUp() {
					cancel()
					return
				}
				t.Reset(r.untilGiveUp())
			}
		}
	}()
	return ctx, cancel
}

// giveUpLook is how often withGiveUp looks once the give-up time has passed
// without the run giving up.
const giveUpLook = 250 * time.Millisecond

// untilGiveUp is how long until gaveUp may next be true: the last renewal
// plus --give-up, and at least giveUpLook.
func (r *Run) untilGiveUp() time.Duration {
	return max(time.Until(time.Unix(0, r.lastRenew.Load()).Add(r.cfg.GiveUp)), giveUpLook)
}

// giveUp leaves the run unsettled for settle and returns 255; a run no
// launch attempt can have sent is settled not_started instead (nothing
// will ever start it), so that settle does not wait on a host that may
// never answer.
func (r *Run) giveUp() int {
	reason := fmt.Sprintf("no renewal succeeded for %v (--give-up); the lease has ended the run on the host", r.cfg.GiveUp)
	if !r.isLaunched() && !r.mayHaveSent.Load() {
		reason = fmt.Sprintf("%s could not be reached for %v (--give-up); no attempt got as far as the login, so the command was never sent", r.cfg.Dest, r.cfg.GiveUp)
		r.settle(ledger.NotStarted, -1, "", reason)
		r.cfg.Notice(fmt.Sprintf("run %s: not started: %s", r.cfg.ID, reason))
		return exitcode.Lost
	}
	if !r.isLaunched() {
		reason = fmt.Sprintf("%s could not be reached for %v (--give-up); the run was never seen to start", r.cfg.Dest, r.cfg.GiveUp)
	}
	r.leave(reason)
	return r.unknown(reason)
}

// leave leaves the run unsettled for settle, saying why: the same
// whatever signals arrived, launching for a run never seen to start
// (settle may find it not started), else detached (onGiveUp).
func (r *Run) leave(reason string) {
	r.move(onGiveUp, func(l *ledger.Record, _ runState) {
		l.Reason = reason
		l.ControllerPID, l.ControllerStart = 0, 0
	})
}
