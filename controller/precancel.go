package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/ledger"
)

// The launch phase: from the ledger's launching record to the run's record
// from the host (or a verdict that the host has the run). A cancel here
// ends at once what is in flight (a connection attempt, a probe, a backoff
// wait), killing the ssh clients' process groups, and then:
//   - no launch can have sent its command (see mayHaveSent): settled,
//     not_started, exit 143;
//   - one may have (it was killed after the login, or cannot be judged):
//     `reconcile` over a new connection, bounded by launchProbeTimeout,
//     decides: no such run is not_started (143); a run is the run, and its
//     cancel is the confirmed remote cancel of any launched run; no answer
//     is unknown (255), the ledger left unsettled for settle.

// launchProbeTimeout bounds the reconcile that learns whether a cancelled
// launch reached the host.
const launchProbeTimeout = 5 * time.Second

// untilCancel returns ctx that also ends when Cancel is called before the
// run is launched.
func (r *Run) untilCancel(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-r.cancelCh:
			if !r.isLaunched() {
				cancel()
			}
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// launchStep is one step of Follow's launch phase: a probe of a launch that
// may have reached the host, or a launch. probe says whether one may have
// (and is updated). done: Follow returns code.
func (r *Run) launchStep(ctx context.Context, b *backoff, probe *bool) (code int, done bool) {
	cctx, stop := r.untilCancel(ctx)
	defer stop()
	if *probe {
		if r.cancelRequested() {
			return r.cancelMaybeLaunched(ctx)
		}
		v, res := r.reconcile(cctx)
		switch {
		case v != nil:
			// The lost launch did reach the host: the run is there (its
			// record was not seen; reconcile has no pid).
			r.running(&launchRecord{RunID: r.cfg.ID})
			return 0, false
		case noSuchRun(v, res) && r.cancelRequested():
			return r.cancelledBeforeLaunch("cancelled before the launch reached the host")
		case noSuchRun(v, res):
			*probe = false // never claimed: launch again (the claim is atomic)
		case res.Lost() && r.cancelRequested():
			return r.cancelMaybeLaunched(ctx)
		case res.Lost():
			r.detached(res.Why())
			b.wait(cctx)
			return 0, false
		default:
			return r.launchFailed(ctx, res.Code, ""), true
		}
	}
	if r.cancelRequested() {
		return r.cancelledBeforeLaunch("cancelled before the launch")
	}
	res, rec, said := r.launch(cctx)
	switch {
	case rec != nil && res.Lost():
		r.detached(res.Why())
		b.wait(ctx)
		return 0, false
	case rec != nil:
		return r.finish(ctx, res.Code)
	case !res.Lost():
		return r.launchFailed(ctx, res.Code, said), true
	}
	if f, ok := permanent(r.h, res); ok && !r.cancelRequested() {
		return r.cannotConnect(f), true
	}
	*probe = mayHaveSent(r.h, res)
	if *probe {
		r.mayHaveSent.Store(true)
	}
	if r.cancelRequested() {
		return 0, false // the next step answers the cancel
	}
	r.detached(res.Why())
	b.wait(cctx)
	return 0, false
}

// cancelledBeforeLaunch settles a run cancelled before any launch reached
// the host.
func (r *Run) cancelledBeforeLaunch(reason string) (int, bool) {
	r.settle(ledger.NotStarted, -1, "", reason)
	r.cfg.Notice(fmt.Sprintf("run %s: not started (%s)", r.cfg.ID, reason))
	return exitCancelledBeforeLaunch, true
}

// cancelMaybeLaunched answers a cancel when a launch may have sent its
// command: the host, asked over a new connection within
// launchProbeTimeout, says whether it has the run.
func (r *Run) cancelMaybeLaunched(ctx context.Context) (int, bool) {
	v, res := askVerdict(ctx, r.h, r.cfg.ID, launchProbeTimeout)
	switch {
	case v != nil:
		// It reached the host: a run like any other now, cancelled by the
		// remote cancel, confirmed (cancelLoop starts once running wakes it).
		r.running(&launchRecord{RunID: r.cfg.ID})
		return 0, false
	case noSuchRun(v, res):
		return r.cancelledBeforeLaunch("cancelled before the launch reached the host")
	}
	why := res.Why()
	if res.Code == -1 && res.SSHLog == "" {
		why = fmt.Sprintf("no answer within %v", launchProbeTimeout)
	} else if !res.Lost() {
		why = fmt.Sprintf("reconcile exited %d without a verdict", res.Code)
	}
	reason := fmt.Sprintf("cancelled while a launch may have reached %s, and the host could not be asked (%s)", r.cfg.Dest, why)
	r.leave(reason) // never seen to start: launching, as after a give-up
	return r.unknown(reason), true
}
