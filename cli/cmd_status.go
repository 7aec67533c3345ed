package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func init() {
	register(&command{name: "status", summary: "print a run's record: status RUN_ID", run: runStatus})
	register(&command{name: "list", summary: "list runs: list [--json]", run: runList})
	register(&command{name: "verify", summary: "check a run's journal hash chain: verify RUN_ID", run: runVerify})
}

// openRun validates id, opens the root (never creating it) and the run
// directory. On failure it prints the error and returns the exit code.
func (e *Env) openRun(id string) (*rundir.Root, *rundir.Dir, int) {
	if err := rundir.ValidID(id); err != nil {
		e.errorf("%v", err)
		e.hint("run IDs match %s", rundir.IDPattern)
		return nil, nil, ExitUsage
	}
	root, code := e.openRoot(false)
	if root == nil {
		return nil, nil, code
	}
	d, err := root.Open(id)
	if err != nil {
		root.Close()
		e.errorf("%v", err)
		switch {
		case errors.Is(err, rundir.ErrNoRun):
			e.hint("list the runs with 'agent-wrap list'")
			return nil, nil, ExitNoRun
		case rundir.IsUnsafe(err):
			e.hint("a run directory must be a real directory owned by you, mode 0700; nothing was read through it")
			return nil, nil, ExitUnsafeRoot
		}
		return nil, nil, ExitFailure
	}
	return root, d, 0
}

func runStatus(e *Env, args []string) int {
	fs := e.flags("status")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("status takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	rec, err := statusfile.Read(d)
	if err != nil {
		e.errorf("%v", err)
		e.hint("the record is unreadable; 'agent-wrap reconcile %s' says what is known", d.ID)
		return ExitFailure
	}
	b, _ := statusfile.Marshal(rec)
	e.Stdout.Write(b)
	return ExitOK
}

// listRow is one run in `list --json`.
type listRow struct {
	RunID         string `json:"run_id"`
	State         string `json:"state"`
	Cause         string `json:"cause,omitempty"`
	PID           int    `json:"pid"`
	CreatedAt     string `json:"created_at"`
	DeadlineEpoch *int64 `json:"deadline_epoch"`
	ExitCode      *int   `json:"exit_code,omitempty"`
	Error         string `json:"error,omitempty"`
}

func runList(e *Env, args []string) int {
	fs := e.flags("list")
	asJSON := fs.Bool("json", false, "one JSON object per line per run")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return e.usageError("list takes no arguments")
	}
	root, code := e.openRoot(false)
	if root == nil {
		if code == ExitNoRun {
			return ExitOK // no root yet: no runs
		}
		return code
	}
	defer root.Close()
	ids, err := root.List()
	if err != nil {
		e.errorf("%v", err)
		return ExitFailure
	}
	var rows []listRow
	for _, id := range ids {
		rows = append(rows, readListRow(root, id))
	}
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		for _, r := range rows {
			enc.Encode(r)
		}
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN_ID\tSTATE\tPID\tAGE\tLEASE_LEFT")
	now := time.Now()
	for _, r := range rows {
		age, left := "-", "-"
		if t, err := time.Parse(time.RFC3339Nano, r.CreatedAt); err == nil {
			age = now.Sub(t).Truncate(time.Second).String()
		}
		if r.DeadlineEpoch != nil && !statusfile.Terminal(r.State) {
			d := time.Unix(*r.DeadlineEpoch, 0).Sub(now).Truncate(time.Second)
			left = d.String()
			if d <= 0 {
				left = "expired"
			}
		}
		state := r.State
		if r.Error != "" {
			state = "unreadable"
		}
		pid := "-"
		if r.PID > 0 {
			pid = fmt.Sprint(r.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.RunID, state, pid, age, left)
	}
	tw.Flush()
	return ExitOK
}

func readListRow(root *rundir.Root, id string) listRow {
	row := listRow{RunID: id}
	d, err := root.Open(id)
	if err != nil {
		row.State, row.Error = "unknown", err.Error()
		return row
	}
	defer d.Close()
	rec, err := statusfile.Read(d)
	if err != nil {
		row.State, row.Error = "unknown", err.Error()
	} else {
		row.State, row.Cause, row.PID, row.CreatedAt, row.ExitCode = rec.State, rec.Cause, rec.PID, rec.CreatedAt, rec.ExitCode
	}
	if dl, err := lease.ReadDeadline(d); err == nil {
		row.DeadlineEpoch = &dl
	}
	return row
}

func runVerify(e *Env, args []string) int {
	fs := e.flags("verify")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("verify takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		e.errorf("%v", err)
		return ExitFailure
	}
	defer f.Close()
	n, err := journal.Verify(f)
	if err != nil {
		e.errorf("run %s: %s: %v", d.ID, rundir.EventsFile, err)
		return ExitFailure
	}
	fmt.Fprintf(e.Stdout, "%s: journal intact, %d events\n", d.ID, n)
	return ExitOK
}
