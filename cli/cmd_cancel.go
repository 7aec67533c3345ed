package cli

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

func init() {
	register(&command{name: "cancel", summary: "stop a run and confirm it: cancel [--grace D] [--wait D] RUN_ID", run: runCancel})
	register(&command{name: "renew", summary: "extend a run's lease: renew [--lease D] RUN_ID", run: runRenew})
}

// runCancel is the second control channel. With the wrapper alive (PID and
// start time verified) it records the cancel, TERMs the wrapper and waits for
// its final record; with the wrapper gone it performs the validated, ordered
// stop itself. If the wrapper dies while we wait, we take over.
func runCancel(e *Env, args []string) int {
	fs := e.flags("cancel")
	var grace, wait durationValue
	grace = -1
	wait = durationValue(60 * time.Second)
	fs.Var(&grace, "grace", "time `D` between TERM and KILL when cancel stops the run itself (default: the run's own grace)")
	fs.Var(&wait, "wait", "how long `D` to wait for a confirmed final record")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("cancel takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	until := time.Now().Add(time.Duration(wait))

	rec, err := statusfile.Read(d)
	if err != nil {
		e.errorf("%v", err)
		e.hint("nothing was signalled; 'agent-wrap reconcile %s' says what is known", d.ID)
		return ExitFailure
	}
	if statusfile.Terminal(rec.State) {
		e.printFinal(rec, "already")
		return ExitOK
	}
	if membership.WrapperAlive(rec) {
		w := d.Watch()
		defer w.Close()
		if err := requestCancel(d); err != nil {
			e.errorf("run %s: %v", d.ID, err)
			if !errors.Is(err, errIntentOnly) {
				return ExitFailure
			}
		}
		err := proc.Signal(proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}, unix.SIGTERM)
		if err != nil && !errors.Is(err, proc.ErrGone) {
			e.errorf("run %s: cannot signal the wrapper %d: %v", d.ID, rec.WrapperPID, err)
		}
		for time.Now().Before(until) {
			cur, err := statusfile.Read(d)
			if err == nil && statusfile.Terminal(cur.State) {
				return e.confirm(cur)
			}
			if err == nil && !membership.WrapperAlive(cur) {
				break // the wrapper died mid-stop: finish the job ourselves
			}
			w.Wait(100 * time.Millisecond)
		}
		if !time.Now().Before(until) {
			e.errorf("run %s: not confirmed within %v: the wrapper (pid %d) has not written a final record", d.ID, time.Duration(wait), rec.WrapperPID)
			e.hint("check again with 'agent-wrap reconcile %s'", d.ID)
			return ExitFailure
		}
	}
	g := time.Duration(grace)
	if g < 0 {
		g = time.Duration(rec.GraceSeconds * float64(time.Second))
	}
	rep, err := stop.Outside(d, stop.Options{Grace: g, Cause: statusfile.CauseCancel, Intent: "cancel_requested", By: "cancel", Diag: e.Stderr, Fields: journal.Fields{"pid": os.Getpid()}})
	if err != nil {
		e.errorf("%v", err)
		if errors.Is(err, stop.ErrRefused) {
			e.hint("nothing was signalled; 'agent-wrap reconcile %s' explains the run's state", d.ID)
		}
		return ExitFailure
	}
	for _, r := range rep.Rejected {
		e.errorf("run %s: %s", d.ID, r)
	}
	if rep.Already {
		e.printFinal(rep.Record, "already")
		return ExitOK
	}
	return e.confirm(rep.Record)
}

// requestCancel records the cancel (intent journaled and synced, then
// `cancelling` with cause cancel) under the run's lock, unless the run is
// already stopping, in which case its first cause stands.
func requestCancel(d *rundir.Dir) error {
	unlock, err := d.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := statusfile.Read(d)
	if err != nil {
		return err
	}
	if statusfile.Terminal(rec.State) || rec.State == statusfile.Cancelling {
		return nil
	}
	if _, err := journal.Append(d, "cancel_requested", journal.Fields{"cause": statusfile.CauseCancel, "by": "cancel", "pid": os.Getpid()}, true); err != nil {
		return fmt.Errorf("cannot journal the cancel, so nothing was signalled: %w", err)
	}
	rec.State, rec.Cause = statusfile.Cancelling, statusfile.CauseCancel
	if err := statusfile.Write(d, rec, false); err != nil {
		// The synced intent line is the durable fact; a record we cannot
		// write (a full disk) must not keep the job running. The wrapper
		// then records the stop as caused by our TERM (exit 143 either way).
		return fmt.Errorf("%w: %v", errIntentOnly, err)
	}
	return nil
}

// errIntentOnly: the cancel is journaled but `cancelling` could not be
// written; the caller signals the wrapper anyway.
var errIntentOnly = errors.New("the cancel is journaled, but the cancelling record could not be written")

// confirm prints the final record's summary: exit 0 when the run is terminal
// and nothing survived, 1 otherwise.
func (e *Env) confirm(rec *statusfile.Record) int {
	e.printFinal(rec, "")
	if !statusfile.Terminal(rec.State) || len(rec.Survivors) > 0 {
		if len(rec.Survivors) > 0 {
			e.errorf("run %s: cleanup not confirmed: %v outlived KILL", rec.RunID, rec.Survivors)
		}
		return ExitFailure
	}
	return ExitOK
}

func (e *Env) printFinal(rec *statusfile.Record, already string) {
	if already != "" {
		already += " "
	}
	cause := ""
	if rec.Cause != "" {
		cause = " (cause " + rec.Cause + ")"
	}
	fmt.Fprintf(e.Stdout, "%s: %s%s%s, exit code %d, survivors %v\n", rec.RunID, already, rec.State, cause, rec.Code(), rec.Survivors)
}

func runRenew(e *Env, args []string) int {
	fs := e.flags("renew")
	var d durationValue
	fs.Var(&d, "lease", "new lease `D` from now (default: the run's own lease)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("renew takes one RUN_ID")
	}
	root, dir, code := e.openRun(fs.Arg(0))
	if dir == nil {
		return code
	}
	defer root.Close()
	defer dir.Close()
	next, err := lease.Renew(dir, time.Duration(d))
	if err != nil {
		e.errorf("%v", err)
		if errors.Is(err, lease.ErrRefused) {
			e.hint("'agent-wrap status %s' shows the run; start a new run if the work must go on", dir.ID)
		}
		return ExitFailure
	}
	fmt.Fprintf(e.Stdout, "%s: deadline %d (%s)\n", dir.ID, next, time.Unix(next, 0).UTC().Format(time.RFC3339))
	return ExitOK
}
