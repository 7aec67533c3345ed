//go:build linux

package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
)

func init() {
	register(&command{
		name:     "reconcile",
		summary:  "say what happened to runs, without acting",
		synopsis: "reconcile [--json] RUN_ID... | reconcile [--json] --all",
		help:     reconcileHelp,
		exits: "0 all completed or cancelled; 3 some running (none unknown); 4 some unknown (4 wins over 3); " +
			"66 some named run does not exist (wins over both); 64 usage; 78 unsafe run root",
		run: runReconcile,
	})
}

const reconcileHelp = `reconcile reads a run's record and the live process table and says, without
acting, what happened to it: completed, cancelled, running or unknown.`

func runReconcile(e *Env, args []string) int {
	fs := e.flags("reconcile")
	asJSON := fs.Bool("json", false, "one JSON object per line per run: run_id, outcome, exit_code, reason, supervisor, evidence")
	all := fs.Bool("all", false, "every run under the root")
	fs.SetInterspersed(true) // RUN_IDs only, no job argv: flags may come anywhere
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	ids := fs.Args()
	switch {
	case *all && len(ids) > 0:
		return e.usageError("reconcile takes RUN_IDs or --all, not both")
	case !*all && len(ids) == 0:
		return e.usageError("reconcile needs a RUN_ID or --all")
	}
	if code := e.checkIDs(ids...); code != 0 {
		return code
	}
	var root *rundir.Root
	var code int
	if *all {
		root, ids, code = e.allRuns()
	} else {
		root, code = e.openRoot(false)
	}
	if root == nil {
		return code
	}
	defer root.Close()
	exit, missing := ExitOK, false
	enc := json.NewEncoder(e.Stdout)
	enc.SetEscapeHTML(false)
	for _, id := range ids {
		v, err := verdictFor(root, id)
		if err != nil {
			missing = true
			e.errorf("%v", err)
			continue
		}
		exit = reconcile.Worst(exit, reconcile.OutcomeExit(v.Outcome))
		if *asJSON {
			enc.Encode(v)
		} else {
			fmt.Fprintln(e.Stdout, humanVerdict(v))
		}
	}
	if missing {
		e.hint("list the runs with 'agent-wrap list'")
		return ExitNoRun
	}
	return exit
}

// verdictFor judges one run. The only error is rundir.ErrNoRun: a run
// directory that cannot be opened safely is a verdict (unknown), since the
// run may well exist.
func verdictFor(root *rundir.Root, id string) (reconcile.Verdict, error) {
	d, err := root.Open(id)
	if err != nil {
		if errors.Is(err, rundir.ErrNoRun) {
			return reconcile.Verdict{}, err
		}
		if errors.Is(err, rundir.ErrUnsafe) {
			err = fmt.Errorf("%v; nothing was read through it", err)
		}
		return reconcile.Decide(reconcile.Input{RunID: id, RecordErr: err}), nil
	}
	defer d.Close()
	return reconcile.Decide(reconcile.Gather(d)), nil
}

// humanVerdict is one line: "ID: outcome (exit N), supervisor lost: reason".
func humanVerdict(v reconcile.Verdict) string {
	var b strings.Builder
	b.WriteString(v.RunID + ": " + v.Outcome)
	if v.ExitCode != nil {
		fmt.Fprintf(&b, " (exit %d)", *v.ExitCode)
	}
	if v.Supervisor == reconcile.SupervisorLost && !strings.HasPrefix(v.Reason, "supervisor lost") {
		b.WriteString(", supervisor lost")
	}
	b.WriteString(": " + v.Reason)
	return b.String()
}
