package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// What Settle found, as settle's exit code gives it.
const (
	SettleDone        = exitcode.OK      // the outcome is recorded (settled)
	SettleRunning     = exitcode.Running // the run is still running on its host (or its controller still drives it)
	SettleUnknown     = exitcode.Unknown // the host cannot say; recorded as settled, outcome unknown
	SettleUnreachable = exitcode.Lost    // the host could not be asked; nothing changed
)

// Needed reports whether Settle has something to learn about rec: it is
// not settled, or settled with outcome unknown (the host may know more by
// now, say after a cancel gave the run its final record).
func Needed(rec *ledger.Record) bool {
	return rec.State != ledger.Settled || rec.Outcome == ledger.Unknown
}

// SettleOptions are Settle's choices.
type SettleOptions struct {
	// LogDir is where the run's controller kept its ssh logs (Config.LogDir);
	// what a killed controller left there is removed once the run is settled.
	LogDir string
}

// ErrAlreadySettled comes with SettleDone for a run that was settled
// before this Settle could claim it (by its controller, or by another
// settle at the same time): nothing was written.
var ErrAlreadySettled = errors.New("already settled")

// Settle asks the host of run id, over the record's own rsh, destination,
// remote binary and root, for its verdict (`reconcile --json`), and
// records the outcome in the ledger, durably. It never signals anything. It
// returns the record as it now stands, what it found (the Settle*
// constants) and, for SettleUnreachable and SettleRunning, why.
//
// It claims the run first (ledger.Store.Claim): a run another settle holds
// is left to it (SettleRunning, ledger.ErrBusy), and the outcome is written
// under the claim, so that two settles at once settle a run once. A run
// whose owner still drives it (ledger.OwnerGone: its process on this
// machine, its heartbeat elsewhere) is left alone: the controller settles
// it. What the verdict means is judge's to say (outcome.go): the host's 66
// (no such run), say, is not_started only while the ledger says launching,
// since a run that was seen running cannot have not started; otherwise it
// is unknown.
func Settle(ctx context.Context, l ledger.Store, id string, opt SettleOptions) (*ledger.Record, int, error) {
	rec, err := l.Read(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	if !Needed(rec) {
		return rec, SettleDone, ErrAlreadySettled
	}
	claim, err := l.Claim(ctx, id)
	if errors.Is(err, ledger.ErrBusy) {
		return rec, SettleRunning, errors.New("another settle is settling it")
	}
	if err != nil {
		return rec, SettleUnreachable, err
	}
	defer claim.Release()
	rec = claim.Record
	if !Needed(rec) {
		return rec, SettleDone, ErrAlreadySettled
	}
	me := Self()
	if !ledger.OwnerGone(rec, me, claim.Now, proc.Alive) {
		who := fmt.Sprintf("pid %d", rec.ControllerPID)
		if rec.Controller != nil && !rec.Controller.SameMachine(me) {
			who = fmt.Sprintf("%s, heartbeat %s ago", rec.Controller, claim.Now.Sub(rec.HeartbeatAt).Round(time.Second))
		}
		return rec, SettleRunning, fmt.Errorf("its controller (%s) is still driving it", who)
	}
	h, err := transport.NewHost(rec.Rsh, rec.Dest, rec.RemoteBin, rec.RemoteRoot, os.TempDir(), id)
	if err != nil {
		return rec, SettleUnreachable, err
	}
	defer h.Close()
	h.NoKeepalive() // one short call: ssh's own timeouts do
	v, res := askVerdict(ctx, h, id, time.Duration(rec.Grace*float64(time.Second))+60*time.Second)
	j := judge(facts{at: atSettle, code: -1, state: rec.State, asked: true, v: v, res: res, dest: rec.Dest, bin: rec.RemoteBin})
	switch j.next {
	case doRetry, doLeave:
		return rec, SettleUnreachable, errors.New(j.reason)
	case doFollow:
		return rec, SettleRunning, errors.New(j.reason)
	}
	rec.MarkSettled(j.outcome, j.code, j.cause, j.reason)
	rec.SettledBy = me
	if err := claim.Settle(ctx, rec); err != nil {
		return rec, SettleUnreachable, err
	}
	// The controller is gone (checked above): what it left of ssh's logs
	// is of no further use.
	transport.RemoveSSHLogs(opt.LogDir, id)
	if j.outcome == ledger.Unknown {
		return rec, SettleUnknown, nil
	}
	return rec, SettleDone, nil
}
