// Package watchdog enforces leases when a run's wrapper cannot: it stops
// every run under a root whose deadline has passed and whose wrapper is dead
// or has not acted within ActAfter, with the same ordered stop that cancel
// uses (stop.Outside). One watchdog runs per root (LockFile).
//
// Pass is one look at every run. Serve is the service around it, for cron
// (one pass) and systemd (a pass every interval): it holds the lock, prints
// each action as a JSON line and keeps the service manager told
// (Notifier, the sd_notify(3) client).
package watchdog

import (
	"errors"
	"io"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// ActAfter is how long past a deadline a live wrapper has to act on it
// before the watchdog stops the run itself. The wrapper's own timer fires at
// the deadline; this covers a wrapper that is stopped (SIGSTOP), wedged or
// starved.
const ActAfter = 3 * time.Second

// LockFile is the root-level lock file that keeps one watchdog per root.
const LockFile = ".watchdog.lock"

// Action is one thing a watchdog pass did or could not do, printed as one
// JSON line. Healthy runs produce no action.
type Action struct {
	RunID     string   `json:"run_id"`
	Action    string   `json:"action"` // stopped, refused, skipped
	Reason    string   `json:"reason"`
	Deadline  int64    `json:"deadline_epoch,omitempty"`
	State     string   `json:"state,omitempty"`
	Cause     string   `json:"cause,omitempty"`
	ExitCode  *int     `json:"exit_code,omitempty"`
	Signalled []int    `json:"signalled,omitempty"`
	Survivors []int    `json:"survivors,omitempty"`
	Rejected  []string `json:"rejected,omitempty"`
	// Note says what the watchdog disregarded: a deadline_epoch that
	// disagrees with the journal, a lease that could not be read.
	Note string `json:"note,omitempty"`
}

// Options configure a pass.
type Options struct {
	Grace time.Duration // 0: each run's own grace_seconds
	Now   func() time.Time
	// Progress, if set, is called after each run is looked at, so a long
	// pass (several stops, each up to grace plus up to 10 s of KILL) can keep a service
	// manager's watchdog fed.
	Progress func()
	// Diag receives what a stop could not do on its way (a journal line it
	// could not write, say); nil discards it.
	Diag io.Writer

	// unrecorded holds the runs a pass stopped without their intent on
	// record and whose final record could not be written (a read-only
	// file system): a later pass of the same service records the gap
	// when it can write again. Serve sets it.
	unrecorded map[string]bool
}

// Pass looks at every run under root once and stops each whose deadline has
// passed and whose wrapper is dead, or alive but has not acted within
// ActAfter. A run that cannot be read is reported and skipped; a pass never
// stops on one bad run.
func Pass(root *rundir.Root, o Options) ([]Action, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	ids, err := root.List()
	if err != nil {
		return nil, err
	}
	var out []Action
	for _, id := range ids {
		if a := check(root, id, o); a != nil {
			out = append(out, *a)
		}
		if o.Progress != nil {
			o.Progress()
		}
	}
	return out, nil
}

func check(root *rundir.Root, id string, o Options) *Action {
	d, err := root.Open(id)
	if err != nil {
		return &Action{RunID: id, Action: "skipped", Reason: err.Error()}
	}
	defer d.Close()
	// Terminal runs, most of a root, cost one read: the record.
	// An unreadable record is rebuilt from the run's other files (the
	// journal, pid, pgid): a torn status.json stops nobody's stop.
	rec, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		return &Action{RunID: id, Action: "skipped", Reason: err.Error()}
	}
	if statusfile.Terminal(rec.State) {
		return nil
	}
	// The journal's deadline: a hand-written later deadline_epoch revives
	// nothing (note says it was ignored).
	dl, note, derr := lease.Effective(d)
	if derr != nil && !errors.Is(derr, lease.ErrNoDeadline) {
		// No readable lease: treated as expired.
		note = "no readable deadline (" + derr.Error() + "): the lease counts as expired"
		dl, derr = 0, nil
	}
	now := o.Now()
	if derr == nil && now.Before(time.Unix(dl, 0)) {
		return nil
	}
	if errors.Is(derr, lease.ErrNoDeadline) && rec.State == statusfile.Starting && rec.LeaseSeconds > 0 && !membership.WrapperAlive(rec) {
		// The wrapper died while starting the job, before it wrote the
		// deadline, which it would have set no later than created_at +
		// lease (+ ActAfter for a slow start). Nobody can renew a run that
		// is not running, so that deadline is final. (The deadline is
		// written with the first record now; a run of an older version,
		// or one whose deadline could not be written, has none.)
		created, err := time.Parse(time.RFC3339Nano, rec.CreatedAt)
		if err != nil {
			return &Action{RunID: id, Action: "skipped", State: rec.State, Reason: "the wrapper died while starting the run, and its created_at does not parse: " + err.Error()}
		}
		dl = lease.DeadlineAfter(created, time.Duration(rec.LeaseSeconds*float64(time.Second))+ActAfter)
		if now.Before(time.Unix(dl, 0)) {
			return nil
		}
		derr = nil
	}
	if errors.Is(derr, lease.ErrNoDeadline) {
		if rec.LeaseSeconds <= 0 || rec.State == statusfile.Starting {
			return nil // no lease: nothing for the watchdog to enforce
		}
		// A lease, but neither the journal nor deadline_epoch says
		// when it ends: no readable lease counts as expired.
		note = "the run has a lease but no readable deadline (journal or deadline_epoch): the lease counts as expired"
		dl, derr = 0, nil
	}
	alive := membership.WrapperAlive(rec)
	if alive && (rec.State == statusfile.Cancelling || now.Before(time.Unix(dl, 0).Add(ActAfter))) {
		return nil // the wrapper is on it
	}
	reason := "lease expired and the wrapper is gone"
	if alive {
		reason = "lease expired and the wrapper has not acted within " + ActAfter.String()
	}
	grace := o.Grace
	if grace <= 0 {
		grace = time.Duration(rec.GraceSeconds * float64(time.Second))
	}
	rep, err := stop.Outside(d, stop.Options{
		Grace:  grace,
		Cause:  statusfile.CauseLease,
		Intent: "deadline_expired",
		By:     "watchdog",
		Fields: journal.Fields{"deadline_epoch": dl},
		Diag:   o.Diag,

		IntentUnrecorded: o.unrecorded[id],
	})
	if o.unrecorded != nil {
		if rep != nil && rep.IntentUnrecorded && err != nil {
			o.unrecorded[id] = true
		} else if err == nil {
			delete(o.unrecorded, id)
		}
	}
	if err != nil && (rep == nil || rep.Record == nil) {
		return &Action{RunID: id, Action: "refused", Deadline: dl, State: rec.State, Reason: err.Error(), Note: note}
	}
	if rep.Already {
		return nil
	}
	if rec.Rebuilt {
		reason += "; its record was unreadable and was rebuilt from the journal and pid files"
	}
	if rep.IntentUnrecorded {
		reason += "; the intent could not be journaled (intent_unrecorded), the stop went ahead"
	}
	if err != nil {
		reason += "; " + err.Error()
	}
	a := &Action{RunID: id, Action: "stopped", Reason: reason, Deadline: dl, State: rep.Record.State, Cause: rep.Record.Cause,
		ExitCode: rep.Record.ExitCode, Signalled: rep.Signalled, Survivors: rep.Record.Survivors, Rejected: rep.Rejected, Note: note}
	return a
}
