package cli

import (
	"errors"
	"fmt"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// `ledger forget` retires a run the ledger still calls launching: one no
// controller drives any more and that never started on its host. It is
// settle, kept to such runs and to one outcome: it asks the host, and only
// the host's "no such run" (not_started) retires the run. A run that may
// have reached its host is never forgotten on the ledger's word alone:
// while its host cannot be asked, the ledger keeps it. Like show, it is a
// word of `ledger`, printing its own --help.

const ledgerForgetSynopsis = "ledger forget [--ledger DIR|URL] RUN_ID..."

const ledgerForgetExits = "0 forgotten (settled not_started), or settled already; 1 the run is past launching (settle it); 3 its controller still drives it, or the host runs it; 4 the host cannot say; 255 the host could not be asked (nothing changed); 66 no such run in the ledger; 64 usage; 78 unsafe ledger"

const ledgerForgetHelp = `'ledger forget RUN_ID' retires a run the ledger still calls launching and
whose controller is gone (it gave up, or was killed, before its launch was
seen to reach the host), so that 'settle --all' stops asking about it. It
asks the host, over the run's own --rsh, as settle does: when the host says
it never had the run, the run is settled not_started. A run that may have
reached its host is refused while the host cannot be asked (nothing is
changed): its launch may have started a job there. A run past launching is
settle's, not forget's.`

func runLedgerForget(e *Env, args []string) int {
	fs := e.flags("ledger forget")
	ledgerDir := fs.String("ledger", "", ledgerFlagUsage)
	fs.SetInterspersed(true)
	_ = fs.MarkHidden("root")
	if code, ok := e.parseWord(fs, args, ledgerForgetSynopsis, "retire a run that never launched", ledgerForgetHelp, ledgerForgetExits); !ok {
		return code
	}
	if fs.NArg() == 0 {
		return e.usageError("ledger forget needs a RUN_ID")
	}
	if code := e.checkIDs(fs.Args()...); code != 0 {
		return code
	}
	l, code := e.openLedger(*ledgerDir, false)
	if l == nil {
		return code
	}
	defer l.Close()
	worst, missing := ExitOK, false
	for _, id := range fs.Args() {
		c := e.forgetOne(l, id)
		if c == ExitNoRun {
			missing = true
			continue
		}
		worst = max(worst, c)
	}
	if missing {
		e.hint("'agent-wrap ledger' lists the runs the ledger holds")
		return ExitNoRun
	}
	return worst
}

// forgetOne retires run id if the rules allow, says what became of it,
// and returns its exit code.
func (e *Env) forgetOne(l ledger.Store, id string) int {
	rec, err := l.Read(e.Ctx, id)
	if err != nil {
		e.errorf("ledger forget %s: %v", id, err)
		if errors.Is(err, ledger.ErrNoRecord) {
			return ExitNoRun
		}
		return e.ledgerHint(err)
	}
	switch rec.State {
	case ledger.Settled:
		fmt.Fprintf(e.Stdout, "%s: settled already (%s); nothing to forget\n", id, rec.Outcome)
		return ExitOK
	case ledger.Launching:
	default:
		e.errorf("ledger forget %s: the run is %s: it was seen on %s, so it is not forgotten", id, rec.State, rec.Dest)
		e.hint("'agent-wrap settle %s' asks %s what became of it and records that", id, rec.Dest)
		return ExitFailure
	}
	rec, found, err := controller.Settle(e.Ctx, l, id, controller.SettleOptions{LogDir: e.sshLogDir(l)})
	switch {
	case rec == nil:
		e.errorf("ledger forget %s: %v", id, err)
		return ExitFailure
	case found == controller.SettleDone && rec.Outcome == ledger.NotStarted:
		fmt.Fprintf(e.Stdout, "%s: forgotten: not_started: %s\n", id, rec.Reason)
		return ExitOK
	case found == controller.SettleDone || found == controller.SettleUnknown:
		fmt.Fprintf(e.Stdout, "%s: not forgotten: it reached %s after all; settled %s\n", id, rec.Dest, rec.Outcome)
		return found
	case found == controller.SettleRunning:
		e.errorf("ledger forget %s: not forgotten: %v", id, err)
		if rec.ControllerPID > 0 && rec.Controller != nil && rec.Controller.SameMachine(controller.Self()) {
			e.hint("its controller drives it; to stop it: kill -INT %d", rec.ControllerPID)
		}
		return found
	}
	e.errorf("ledger forget %s: not forgotten: its launch may have reached %s, and %s cannot say it never did: %v", id, rec.Dest, rec.Dest, err)
	e.hint("nothing was changed; 'agent-wrap ledger forget %s' again once %s can be reached retires it if it never started there", id, rec.Dest)
	return found
}
