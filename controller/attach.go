package controller

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// attach runs `attach --from N,M` from the byte counts delivered so far.
func (r *Run) attach(ctx context.Context) transport.Result {
	from := fmt.Sprintf("%d,%d", r.out.n.Load(), r.errw.n.Load())
	if r.now().phase == phaseDetached {
		r.reattaching.Store(from)
		// Renew at once: the lease may have lost renewals while detached,
		// and a renewal that succeeds confirms the host is back.
		select {
		case r.renewNow <- struct{}{}:
		default:
		}
	}
	ctx, cancel := r.withGiveUp(ctx)
	defer cancel()
	var res transport.Result
	snd, stdinFrom := (*stdinSender)(nil), []string(nil)
	if !r.noAttach.Load() {
		snd, stdinFrom = r.stdinSender() // stdin.go: the job's stdin, sent again from the oldest byte kept
	}
	line := r.h.Remote(append(append([]string{"attach", "--from", from}, stdinFrom...), r.cfg.ID)...)
	if r.noAttach.Load() {
		// The host cannot stream: learn the end with wait (75 at the
		// timeout, which finish takes for a live run and follows again).
		line = r.h.Remote("wait", "--timeout", "60s", r.cfg.ID)
	}
	if snd != nil {
		in, done, err := snd.pipe(nil)
		if err != nil {
			return transport.Result{Code: exitcode.Lost, Err: err}
		}
		res = r.h.Call(ctx, transport.Call{Line: line, Stdin: in, Stdout: r.out, Stderr: r.errw, Long: true})
		snd.stop()
		done()
	} else {
		res = r.h.Call(ctx, transport.Call{Line: line, Stdout: r.out, Stderr: r.errw, Long: true})
	}
	if !res.Lost() {
		r.attached()
		if r.cfg.Lease < 0 || r.renewFailed.Load() {
			r.lastRenew.Store(time.Now().UnixNano())
		}
	}
	r.reattaching.Store("")
	return res
}

// attached records that a reattach is up: its first byte arrived, a
// renewal succeeded while it ran, or it ended with the run's code. The
// ledger is running again and the event is attached, once per reattach.
func (r *Run) attached() {
	from, _ := r.reattaching.Swap("").(string)
	if from == "" {
		return
	}
	r.lostSaid.Store(false)
	if _, ok := r.move(onAttached, func(l *ledger.Record, was runState) {
		if was.phase == phaseDetached {
			l.Reason = ""
		}
	}); !ok {
		return
	}
	r.ev.emit(EvAttached, map[string]any{"from": from})
}

// detached records a lost connection, once per loss.
func (r *Run) detached(why string) {
	if r.gaveUp() {
		return // the give-up killed the call; Follow says so next
	}
	if !r.lostSaid.Swap(true) {
		if r.isLaunched() {
			r.cfg.Notice(fmt.Sprintf("run %s: connection to %s lost (%s); reattaching", r.cfg.ID, r.cfg.Dest, why))
		} else {
			until := time.Unix(0, r.lastRenew.Load()).Add(r.cfg.GiveUp).Local()
			r.cfg.Notice(fmt.Sprintf("run %s: cannot reach %s (%s); retrying until %s (--give-up %v); to stop now: Ctrl-C, or kill -INT %d",
				r.cfg.ID, r.cfg.Dest, why, until.Format("15:04:05 MST"), r.cfg.GiveUp, os.Getpid()))
		}
	}
	if r.cfg.Lease < 0 && r.now().phase != phaseDetached {
		r.lastRenew.Store(time.Now().UnixNano()) // no lease: give-up counts from the loss
	}
	if _, ok := r.move(onLost, func(l *ledger.Record, _ runState) { l.Reason = why }); !ok {
		return
	}
	r.ev.emit(EvDetached, map[string]any{"reason": why, "stdout_bytes": r.out.n.Load(), "stderr_bytes": r.errw.n.Load()})
}

// attachRefused says, once, that the host's agent-wrap has no attach, and
// makes Follow learn the run's end with wait instead.
func (r *Run) attachRefused() {
	if r.noAttach.Swap(true) {
		return
	}
	r.cfg.Notice(fmt.Sprintf("run %s: the agent-wrap on %s has no attach command (it is older than this controller), so the job's output is not streamed", r.cfg.ID, r.cfg.Dest))
	r.cfg.Notice(fmt.Sprintf("hint: 'agent-wrap deploy %s' installs this version; 'agent-wrap ssh' waits for the run's end meanwhile", r.cfg.Dest))
}
