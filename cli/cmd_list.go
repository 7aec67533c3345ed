//go:build linux

package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// list judges each run as reconcile does (read-only: reconcile.Gather never
// signals or writes), so a run whose wrapper was killed shows as what it is,
// not as the `running` its record still says.

func init() {
	register(&command{
		name:     "list",
		summary:  "list the runs, each with what reconcile says of it now",
		synopsis: "list [--json]",
		help:     listHelp,
		exits:    "0 (no run root yet is no runs); 1 the run root cannot be read; 64 usage; 78 unsafe run root",
		run:      runList,
	})
}

const listHelp = `One line per run: RUN_ID, STATE (the record's state; "lost" when the
record is not terminal and its wrapper is gone; "unreadable"),
OUTCOME (what 'agent-wrap reconcile' says now: completed, cancelled,
running, running (supervisor lost), unknown), PID, AGE, LEASE_LEFT, EXIT
and CAUSE. --json prints the same per run as one JSON object per line, every
field always present: run_id, state, record_state, outcome, supervisor, pid, created_at,
deadline_epoch, exit_code, cause, reason, error ("" or null when not known).`

// listRow is one run in `list --json`, and the source of its table line.
type listRow struct {
	RunID         string `json:"run_id"`
	State         string `json:"state"`      // the judged state: the record's, "lost" when its wrapper is gone before a final record, "unreadable" when there is no readable record
	Outcome       string `json:"outcome"`    // reconcile's outcome now
	Supervisor    string `json:"supervisor"` // alive, lost or none, as reconcile says
	PID           int    `json:"pid"`
	CreatedAt     string `json:"created_at"`
	DeadlineEpoch *int64 `json:"deadline_epoch"`
	ExitCode      *int   `json:"exit_code"` // null until the run is terminal
	Cause         string `json:"cause"`
	Reason        string `json:"reason"`       // reconcile's reason when the outcome is unknown
	Error         string `json:"error"`        // why the record could not be read
	RecordState   string `json:"record_state"` // the record's own state; "" when unreadable
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
	root, ids, code := e.allRuns()
	if root == nil {
		return code
	}
	defer root.Close()
	rows := listRows(root, ids)
	// One write per 64 KiB, not one per run: a thousand runs listed to a
	// file were a thousand write(2)s, as long as judging them.
	out := bufio.NewWriterSize(e.Stdout, 64<<10)
	defer out.Flush()
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetEscapeHTML(false)
		for _, r := range rows {
			enc.Encode(r)
		}
		return ExitOK
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN_ID\tSTATE\tOUTCOME\tPID\tAGE\tLEASE_LEFT\tEXIT\tCAUSE")
	now := time.Now()
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.State, r.outcomeText(),
			dash(r.PID > 0, fmt.Sprint(r.PID)), r.age(now), r.leaseLeft(now),
			dash(r.ExitCode != nil, fmt.Sprint(deref(r.ExitCode))), dash(r.Cause != "", r.Cause))
	}
	tw.Flush()
	return ExitOK
}

// listRowFrom is the row of a run judged as reconcile would, from the
// evidence gathered for it.
func listRowFrom(id string, in reconcile.Input) listRow {
	row := listRow{RunID: id}
	v := reconcile.Decide(in)
	row.Outcome, row.Supervisor = v.Outcome, v.Supervisor
	if v.Outcome == reconcile.Unknown {
		row.Reason = v.Reason
	}
	if in.Deadline != 0 {
		dl := in.Deadline
		row.DeadlineEpoch = &dl
	}
	if in.Record == nil {
		row.State = stateUnreadable
		if in.RecordErr != nil {
			row.Error = in.RecordErr.Error()
		}
		return row
	}
	rec := in.Record
	row.State, row.Cause, row.PID, row.CreatedAt, row.ExitCode = rec.State, rec.Cause, rec.PID, rec.CreatedAt, rec.ExitCode
	row.RecordState = rec.State
	row.State = judgedState(in, v)
	return row
}

// unopenedRow is the row of a run whose directory cannot be opened.
func unopenedRow(id string, err error) listRow {
	return listRow{RunID: id, State: stateUnreadable, Outcome: reconcile.Unknown, Supervisor: reconcile.SupervisorNone,
		Error: err.Error(), Reason: "the run directory cannot be opened"}
}

func (r listRow) outcomeText() string {
	if r.Outcome == reconcile.Running && r.Supervisor == reconcile.SupervisorLost {
		return "running (supervisor lost)"
	}
	return r.Outcome
}

func (r listRow) age(now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, r.CreatedAt)
	if err != nil {
		return "-"
	}
	return now.Sub(t).Truncate(time.Second).String()
}

func (r listRow) leaseLeft(now time.Time) string {
	// A lost run's lease is enforced by nobody but the watchdog: no
	// countdown is shown for it.
	if r.DeadlineEpoch == nil || statusfile.Terminal(r.State) || r.State == stateUnreadable || r.State == stateLost {
		return "-"
	}
	d := time.Unix(*r.DeadlineEpoch, 0).Sub(now).Truncate(time.Second)
	if d <= 0 {
		return "expired"
	}
	return d.String()
}

func dash(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// listRows judges every run, on as many threads as the Go runtime runs
// (GOMAXPROCS, at most 8): each run is its own files and one look at its
// wrapper, independent of the others, and mostly waits on system calls, so
// a root of a thousand live runs is listed in about the time it takes to
// read their records. The runs whose outcome depends on their members (a
// cancelled run, a wrapper gone) are judged in one read of the process
// table, made after the first look at every one of them
// (reconcile.GatherOutcomeFirst, GatherOutcomeWith): a root of a thousand
// cancelled runs costs one read of the table, not a thousand. The rows keep
// the order of ids.
func listRows(root *rundir.Root, ids []string) []listRow {
	rows := make([]listRow, len(ids))
	firsts := make([]*reconcile.Input, len(ids)) // the first look, where a table is needed
	inParallel(len(ids), func(i int) {
		d, err := root.Open(ids[i])
		if err != nil {
			rows[i] = unopenedRow(ids[i], err)
			return
		}
		defer d.Close()
		in, needsTable := reconcile.GatherOutcomeFirst(d)
		if needsTable {
			firsts[i] = &in
			return
		}
		rows[i] = listRowFrom(ids[i], in)
	})
	var pending []int
	for i, f := range firsts {
		if f != nil {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return rows
	}
	// A table that cannot be read (nil) is read again by each run, which
	// then says why it cannot.
	table, _ := proc.Scan()
	inParallel(len(pending), func(k int) {
		i := pending[k]
		d, err := root.Open(ids[i])
		if err != nil {
			rows[i] = unopenedRow(ids[i], err)
			return
		}
		defer d.Close()
		rows[i] = listRowFrom(ids[i], reconcile.GatherOutcomeWith(d, *firsts[i], table))
	})
	return rows
}

// inParallel calls f(0) ... f(n-1) on min(GOMAXPROCS, 8, n) goroutines and
// returns when every call has.
func inParallel(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := min(runtime.GOMAXPROCS(0), 8, n); w > 0; w-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		}()
	}
	wg.Wait()
}
