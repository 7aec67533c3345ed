package cli

import (
	"encoding/json"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/agent-wrap/agent-wrap/ledger"
)

func init() {
	register(&command{
		name:     "ledger",
		summary:  "list the runs agent-wrap ssh started, unsettled first",
		synopsis: "ledger [--json] [--ledger DIR]\n       agent-wrap [--root DIR] " + ledgerShowSynopsis,
		help:     "ledger lists the runs 'agent-wrap ssh' started, unsettled first, newest first:\nID, destination, state, outcome, exit code, age. 'agent-wrap ledger show RUN_ID'\nshows one of them with its host's timeline. See docs/controller.md.",
		exits:    "0; 78 unsafe ledger",
		run:      runLedger,
	})
}

func runLedger(e *Env, args []string) int {
	if len(args) > 0 && args[0] == "show" {
		return runLedgerShow(e, args[1:])
	}
	fs := e.flags("ledger")
	asJSON := fs.Bool("json", false, "one JSON object per line per run: the ledger record")
	ledgerDir := fs.String("ledger", "", "the ledger `DIR`")
	fs.SetInterspersed(true)
	_ = fs.MarkHidden("root")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return e.usageError("ledger takes no arguments")
	}
	l, code := e.openLedger(*ledgerDir, false)
	if l == nil {
		if code == ExitNoRun {
			return ExitOK // no ledger yet: no runs
		}
		return code
	}
	ids, err := l.List()
	if err != nil {
		e.errorf("ledger: %v", err)
		return ExitFailure
	}
	var recs []*ledger.Record
	for _, id := range ids {
		r, err := l.Read(id)
		if err != nil {
			e.errorf("%v", err)
			continue
		}
		recs = append(recs, r)
	}
	// Unsettled first, then newest first.
	sort.SliceStable(recs, func(i, j int) bool {
		si, sj := recs[i].State == ledger.Settled, recs[j].State == ledger.Settled
		if si != sj {
			return !si
		}
		return recs[i].CreatedAt.After(recs[j].CreatedAt)
	})
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		enc.SetEscapeHTML(false)
		for _, r := range recs {
			enc.Encode(r)
		}
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN_ID\tDEST\tSTATE\tOUTCOME\tEXIT\tAGE")
	for _, r := range recs {
		exit := "-"
		if r.ExitCode != nil {
			exit = fmt.Sprint(*r.ExitCode)
		}
		outcome := r.Outcome
		if outcome == "" {
			outcome = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.Dest, r.State, outcome, exit, time.Since(r.CreatedAt).Truncate(time.Second))
	}
	tw.Flush()
	return ExitOK
}
