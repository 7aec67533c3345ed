// Package gc decides which runs may be deleted, and deletes them: a run is
// removed only when reconcile would say completed or cancelled, its wrapper
// has exited, and it ended before a cutoff. A live run, one whose outcome
// is unknown and one that ended after the cutoff are kept; the decision is
// made again under the run's lock, from its record, right before removal,
// so nothing changes in between.
package gc

import (
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Result is what Collect did with one run.
type Result struct {
	// Removed: the run was removed (with DryRun: it would have been).
	Removed bool
	// Line describes a removed run: "ID (state, exit N, ended T)".
	Line string
	// Kept is why a run was kept when that needs the operator (an outcome
	// reconcile cannot tell, a run that cannot be opened, a bad ended_at);
	// "" when it was kept because it is live or ended after the cutoff.
	Kept string
}

// Collect removes run id under root if the rule allows it (nothing is
// removed when dry is set). The error is a removal that failed.
func Collect(root *rundir.Root, id string, cutoff time.Time, dry bool) (Result, error) {
	d, err := root.Open(id)
	if err != nil {
		return Result{Kept: err.Error()}, nil
	}
	defer d.Close()
	// A run that ended too recently is kept without judging it: judging
	// scans the process table, and most runs under a root are such runs.
	if rec, err := statusfile.Read(d); err == nil && statusfile.Terminal(rec.State) {
		if ended, err := time.Parse(time.RFC3339Nano, rec.EndedAt); err == nil && ended.After(cutoff) {
			return Result{}, nil
		}
	}
	v := reconcile.Decide(reconcile.Gather(d))
	switch {
	case v.Outcome == reconcile.Unknown:
		return Result{Kept: "outcome unknown: " + v.Reason}, nil
	case v.Outcome != reconcile.Completed && v.Outcome != reconcile.Cancelled:
		return Result{}, nil // live
	case v.Supervisor == reconcile.SupervisorAlive:
		return Result{}, nil // over, but its wrapper is still draining: next time
	}
	// Decide again under the run's lock, from the record, so nothing
	// changes between the decision and the removal.
	unlock, err := d.Lock()
	if err != nil {
		return Result{Kept: err.Error()}, nil
	}
	defer unlock()
	rec, err := statusfile.Read(d)
	if err != nil || !statusfile.Terminal(rec.State) {
		return Result{}, nil
	}
	ended, err := time.Parse(time.RFC3339Nano, rec.EndedAt)
	if err != nil {
		return Result{Kept: fmt.Sprintf("its ended_at %q is not a time: %v", rec.EndedAt, err)}, nil
	}
	if ended.After(cutoff) {
		return Result{}, nil
	}
	res := Result{Removed: true, Line: fmt.Sprintf("%s (%s, exit %d, ended %s)", id, rec.State, rec.Code(), rec.EndedAt)}
	if dry {
		return res, nil
	}
	if err := root.RemoveAll(id); err != nil {
		return Result{}, fmt.Errorf("cannot remove %s: %w", id, err)
	}
	return res, nil
}
