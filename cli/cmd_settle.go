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
		synopsis: "settle [--ledger DIR|URL] [--all [--dead] [--controller HOST[:PID]] | RUN_ID...]",
		help:     settleHelp,
		exits:    "0 all settled; 3 some running (or being settled by another settle); 4 some unknown; 255 some host unreachable; 66 a named run is not in the ledger; 64 usage or a bad ledger URL; 69 the database cannot be reached; 77 the database refused access; 78 unsafe ledger, or no ledger of this version in the database",
		run:      runSettle,
	})
}

const settleHelp = `settle asks the host of each unsettled run in the ledger (reconcile --json,
over the run's own --rsh) what became of it and records the outcome:
completed, cancelled, unknown, or not_started (the host never had the run ID
and the ledger still says launching). It signals nothing. A run whose
controller is still driving it is left to it: while its heartbeat is younger
than the run's give-up time and, on this machine, its process lives (a
controller stopped past its give-up time is gone, and exits 255 when it
wakes). Each run is claimed before the host
is asked, so two settles at once settle it once. --dead keeps to the runs
whose controller is gone; --controller HOST[:PID] to one controller's.
`

func runSettle(e *Env, args []string) int {
	fs := e.flags("settle")
	all := fs.Bool("all", false, "every run in the ledger not settled yet (and those settled unknown)")
	dead := fs.Bool("dead", false, "with --all: only the runs whose controller is gone")
	ctl := fs.String("controller", "", "with --all: only the runs of controller `HOST[:PID]`")
	ledgerDir := fs.String("ledger", "", ledgerFlagUsage)
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
	case !*all && (*dead || *ctl != ""):
		return e.usageError("settle: --dead and --controller go with --all")
	}
	l, code := e.openLedger(*ledgerDir, false)
	if l == nil {
		if code == ExitNoRun && *all {
			return ExitOK
		}
		return code
	}
	defer l.Close()
	if *all {
		list, err := l.List(e.Ctx, ledger.Filter{Unsettled: true, Controller: *ctl})
		if err != nil {
			e.errorf("settle: %v", err)
			if list == nil {
				return e.ledgerError(err)
			}
		}
		for _, r := range deadFilter(list, *dead) {
			if controller.Needed(r) {
				ids = append(ids, r.RunID)
			}
		}
	}
	opt := controller.SettleOptions{LogDir: e.sshLogDir(l)}
	worst, missing := ExitOK, false
	for _, id := range ids {
		rec, found, err := controller.Settle(e.Ctx, l, id, opt)
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
			if errors.Is(err, controller.ErrAlreadySettled) {
				line += " (settled already; nothing written)"
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
