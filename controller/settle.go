package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
)

// What Settle found, as settle's exit code gives it.
const (
	SettleDone        = 0   // the outcome is recorded (settled)
	SettleRunning     = 3   // the run is still running on its host (or its controller still drives it)
	SettleUnknown     = 4   // the host cannot say; recorded as settled, outcome unknown
	SettleUnreachable = 255 // the host could not be asked; nothing changed
)

// Needed reports whether Settle has something to learn about rec: it is
// not settled, or settled with outcome unknown (the host may know more by
// now, say after a cancel gave the run its final record).
func Needed(rec *ledger.Record) bool {
	return rec.State != ledger.Settled || rec.Outcome == ledger.Unknown
}

// Settle asks the host of run id, over the record's own rsh, destination,
// remote binary and root, for its verdict (`reconcile --json`), and
// records the outcome in the ledger, durably. It never signals anything. It
// returns the record as it now stands, what it found (the Settle*
// constants) and, for SettleUnreachable and SettleRunning, why.
//
// A run whose controller is still alive (PID and start time as recorded) is
// left alone: the controller settles it. The host's 66 (no such run) is
// not_started only while the ledger says launching, since a run that was
// seen running cannot have not started; otherwise it is unknown.
func Settle(ctx context.Context, l *ledger.Ledger, id string) (*ledger.Record, int, error) {
	rec, err := l.Read(id)
	if err != nil {
		return nil, 0, err
	}
	if !Needed(rec) {
		return rec, SettleDone, nil
	}
	if controllerAlive(rec) {
		return rec, SettleRunning, fmt.Errorf("its controller (pid %d) is still driving it", rec.ControllerPID)
	}
	h, err := newHost(rec.Rsh, rec.Dest, rec.RemoteBin, rec.RemoteRoot, l, id)
	if err != nil {
		return rec, SettleUnreachable, err
	}
	defer h.close()
	h.noKeepalive() // one short call: ssh's own timeouts do
	v, res := askVerdict(ctx, h, id, time.Duration(rec.Grace*float64(time.Second))+60*time.Second)
	outcome, reason, cause, code := "", "", "", -1
	switch {
	case res.lost():
		return rec, SettleUnreachable, fmt.Errorf("cannot reach %s: %s", rec.Dest, res.why())
	case v == nil && res.code == 66:
		if rec.State == ledger.Launching {
			outcome, reason = ledger.NotStarted, "the host has no run of this ID: it was never started"
		} else {
			outcome, reason = ledger.Unknown, "the host has no run of this ID, though it was seen "+rec.State
		}
	case v == nil && res.code == 127:
		return rec, SettleUnreachable, fmt.Errorf("%s has no agent-wrap at %q (exit 127)", rec.Dest, rec.RemoteBin)
	case v == nil:
		return rec, SettleUnreachable, fmt.Errorf("reconcile on %s exited %d without a verdict", rec.Dest, res.code)
	case v.Outcome == reconcile.Running:
		return rec, SettleRunning, errors.New(v.Reason)
	case v.Outcome == reconcile.Completed || v.Outcome == reconcile.Cancelled:
		outcome, cause, reason = v.Outcome, v.Evidence.Cause, ""
		if v.ExitCode != nil {
			code = *v.ExitCode
		}
	default:
		outcome, cause, reason = ledger.Unknown, v.Evidence.Cause, v.Reason
	}
	rec.MarkSettled(outcome, code, cause, reason)
	if err := l.Update(rec); err != nil {
		return rec, SettleUnreachable, err
	}
	// The controller is gone (checked above): what it left of ssh's logs
	// is of no further use.
	removeSSHLogs(l, id)
	if outcome == ledger.Unknown {
		return rec, SettleUnknown, nil
	}
	return rec, SettleDone, nil
}

// controllerAlive reports whether the recorded controller process still
// runs (same PID, same start time, not a zombie).
func controllerAlive(rec *ledger.Record) bool {
	if rec.ControllerPID <= 0 || rec.ControllerPID == os.Getpid() {
		return false
	}
	st, err := proc.ReadStat(rec.ControllerPID)
	if err != nil || st.State == 'Z' || st.State == 'X' {
		return false
	}
	return rec.ControllerStart == 0 || st.Start == rec.ControllerStart
}
