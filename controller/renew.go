package controller

import (
	"context"
	"time"
)

// renewLoop renews the lease every RenewEvery over its own connection,
// once the run is launched, until a renewal is refused or ctx ends.
func (r *Run) renewLoop(ctx context.Context) {
	if r.cfg.Lease < 0 {
		return
	}
	select {
	case <-r.launched:
	case <-ctx.Done():
		return
	}
	r.lastRenew.Store(time.Now().UnixNano()) // the launch renewed it
	t := time.NewTimer(r.renewDelay())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.renewNow:
		}
		t.Reset(r.renewDelay())
		nl, ok, why := r.nestedRenewal()
		if !ok {
			r.renewFailed.Store(true)
			r.ev.emit(EvRenewFailed, map[string]any{"reason": "refused", "error": why})
			return
		}
		rr := r.renewCall(ctx, nl) // renewbatch.go
		switch {
		case ctx.Err() != nil:
			return
		case rr.ok:
			r.lastRenew.Store(time.Now().UnixNano())
			var f map[string]any
			if rr.batch > 0 {
				f = map[string]any{"batch": rr.batch}
			}
			r.ev.emit(EvRenewed, f)
			r.attached()
			r.nestedRenewed(nl)
		case rr.lost != "":
			r.ev.emit(EvRenewFailed, map[string]any{"reason": "unreachable", "error": rr.lost})
		default:
			// Refused: the run is terminal, cancelling, or past its
			// deadline. Renewing stops; the stream tells the outcome.
			r.renewFailed.Store(true)
			r.ev.emit(EvRenewFailed, map[string]any{"reason": "refused", "error": rr.refused})
			return
		}
	}
}

// progress is called on every write of the job's output.
func (r *Run) progress() {
	r.attached()
	if r.cfg.Lease < 0 || r.renewFailed.Load() {
		r.lastRenew.Store(time.Now().UnixNano())
	}
}
