package controller

import (
	"bytes"
	"context"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
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
		rr := r.renewCall(ctx, nl) // below; batched by the transport (renewbatch.go)
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

// renewResult is how one renewal ended: ok, lost (why) or refused (why).
type renewResult struct {
	ok      bool
	lost    string
	refused string
	batch   int // runs renewed in the same session, when batched
}

// renewCall renews the lease once: batched with the destination's other
// runs when there is a batch and the run renews with its own lease (a
// nested run's capped lease nl goes alone), else over a call of its own.
func (r *Run) renewCall(ctx context.Context, nl time.Duration) renewResult {
	limit := r.renewTimeout(nl)
	if r.h.Batched() && nl <= 0 {
		a := r.h.RenewBatched(ctx, r.cfg.ID, limit)
		switch {
		case a.Renewed:
			return renewResult{ok: true, batch: a.Batch}
		case a.Lost != "":
			return renewResult{lost: a.Lost}
		case !a.Single:
			return renewResult{refused: a.Reason}
		}
	}
	words := []string{"renew", r.cfg.ID}
	if nl > 0 {
		words = []string{"renew", "--lease", nl.String(), r.cfg.ID}
	}
	var out, errb bytes.Buffer
	res := r.h.Call(ctx, transport.Call{Line: r.h.Remote(words...), Stdout: &out, Stderr: &errb, Timeout: limit})
	switch {
	case res.Code == 0:
		return renewResult{ok: true}
	case res.Lost():
		return renewResult{lost: res.Why()}
	}
	return renewResult{refused: lastLine(strings.TrimSpace(errb.String()))}
}

// renewFloor is the least time a renewal is given when the lease allows:
// a renewal period of a second or two is no measure of how long a loaded
// host takes to answer.
const renewFloor = 10 * time.Second

// renewTimeout bounds one renewal: its period, or longer when the period is
// shorter than renewFloor, up to renewFloor and at most half of what the
// lease, or --give-up, has left counting from the last renewal that
// succeeded (lease l: the run's own, or a nested run's capped one). A host
// that answers in 3 s under load keeps a run renewed every 2 s, and a
// renewal that hangs is still given up, and said to have failed, in time
// for the next one.
func (r *Run) renewTimeout(l time.Duration) time.Duration {
	if l <= 0 {
		l = r.cfg.Lease
	}
	if r.cfg.GiveUp > 0 {
		l = min(l, r.cfg.GiveUp)
	}
	left := time.Until(time.Unix(0, r.lastRenew.Load()).Add(l))
	return max(r.cfg.RenewEvery, min(renewFloor, left/2))
}

// renewDelay is the wait for the next renewal: to the next shared instant
// when renewals are batched (nextTick), else --renew-every.
func (r *Run) renewDelay() time.Duration {
	if r.h.Batched() {
		return transport.NextTick(time.Now(), r.cfg.RenewEvery)
	}
	return r.cfg.RenewEvery
}
