package cli

import (
	"errors"
	"fmt"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/ledger"
)

func init() {
	register(&command{
		name:     "settle",
		summary:  "ask the hosts of the controller's runs what became of them and record it",
		synopsis: "settle [--ledger DIR] [--all | RUN_ID...]",
		help:     settleHelp,
		exits:    "0 all settled; 3 some running; 4 some unknown; 255 some host unreachable; 66 a named run is not in the ledger; 64 usage; 78 unsafe ledger",
		run:      runSettle,
	})
}

const settleHelp = `settle asks the host of each unsettled run in the ledger (reconcile --json,
over the run's own --rsh) what became of it and records the outcome:
completed, cancelled, unknown, or not_started (the host never had the run ID
and the ledger still says launching). It signals nothing. A run whose
controller is still alive is left to it.
`

func runSettle(e *Env, args []string) int {
	fs := e.flags("settle")
	all := fs.Bool("all", false, "every run in the ledger not settled yet (and those settled unknown)")
	ledgerDir := fs.String("ledger", "", "the ledger `DIR`")
	fs.SetInterspersed(true)
	_ = fs.MarkHidden("root")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	ids := fs.Args()
	switch {
	case *all && len(ids) > 0:
		return e.usageError("settle takes RUN_IDs or --all, not both")
	case !*all && len(ids) == 0:
		return e.usageError("settle needs a RUN_ID or --all")
	}
	l, code := e.openLedger(*ledgerDir, false)
	if l == nil {
		if code == ExitNoRun && *all {
			return ExitOK
		}
		return code
	}
	if *all {
		list, err := l.List()
		if err != nil {
			e.errorf("settle: %v", err)
			return ExitFailure
		}
		for _, id := range list {
			if r, err := l.Read(id); err == nil && controller.Needed(r) {
				ids = append(ids, id)
			}
		}
	}
	worst, missing := ExitOK, false
	for _, id := range ids {
		rec, found, err := controller.Settle(e.Ctx, l, id)
		if rec == nil {
			e.errorf("settle %s: %v", id, err)
			if errors.Is(err, ledger.ErrNoRecord) {
				missing = true
			} else {
				worst = max(worst, ExitFailure)
			}
			continue
		}
		switch found {
		case controller.SettleDone, controller.SettleUnknown:
			line := rec.RunID + ": " + rec.Outcome
			if rec.ExitCode != nil {
				line += fmt.Sprintf(" (exit %d)", *rec.ExitCode)
			}
			if rec.Cause != "" {
				line += ", cause " + rec.Cause
			}
			if rec.Reason != "" {
				line += ": " + rec.Reason
			}
			fmt.Fprintln(e.Stdout, line)
		case controller.SettleRunning:
			fmt.Fprintf(e.Stdout, "%s: running: %v\n", rec.RunID, err)
		default:
			e.errorf("settle %s: %v", id, err)
			e.hint("nothing was changed; run 'agent-wrap settle %s' again once %s can be reached", id, rec.Dest)
		}
		worst = max(worst, found)
	}
	if missing {
		e.hint("'agent-wrap ledger' lists the runs the ledger holds")
		return ExitNoRun
	}
	return worst
}
