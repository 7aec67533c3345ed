//go:build linux

package cli

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/answer"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

func init() {
	register(&command{
		name:     "cancel",
		summary:  "stop a run and confirm it",
		synopsis: "cancel [--grace D] [--wait D] RUN_ID",
		help: `With the run's wrapper alive, cancel records the cancel and TERMs the wrapper,
which stops the job's process group (TERM, grace, KILL) and writes the final
record. With the wrapper gone, cancel does that ordered stop itself, after
validating every process it signals. A run already over is printed, untouched.

With --json, cancel prints one JSON object instead of its line: run_id,
outcome (confirmed, already, not_confirmed, refused or no_record), state,
cause, exit_code, survivors, and reason when the outcome is not confirmed or
already. The exit code is the same either way.`,
		exits: "0 the run is terminal and nothing of it survived; 1 not confirmed within --wait, " +
			"or processes outlived KILL; 66 no such run; 64 usage; 78 unsafe run root",
		run: runCancel,
	})
	register(&command{
		name:     "renew",
		summary:  "extend a run's lease",
		synopsis: "renew [--lease D] [--json] RUN_ID...",
		help: `The deadline becomes now + D. A run that is over, cancelling, or whose
deadline has already passed is refused: an expired lease is never revived.

With more than one RUN_ID, or with --json, each run is renewed in turn, each
under its own lock, and one JSON line per run says what became of it
(run_id, renewed, state, deadline_epoch, reason): a controller renews all its
runs on one host over one session this way.`,
		exits: "0 renewed (every run named); 1 refused (some run); 66 no such run (the single-run form); 64 usage; 78 unsafe run root",
		run:   runRenew,
	})
}

// runCancel is the second control channel: the protocol is stop.Cancel;
// this maps its report to output and an exit code.
func runCancel(e *Env, args []string) int {
	fs := e.flags("cancel")
	var grace, wait durationValue
	grace = -1
	wait = durationValue(60 * time.Second)
	fs.Var(&grace, "grace", "time `D` between TERM and KILL when cancel stops the run itself (default: the run's own grace)")
	fs.Var(&wait, "wait", "how long `D` to wait for a confirmed final record (default 1m)")
	asJSON := fs.Bool("json", false, "print one JSON object (run_id, outcome, state, cause, exit_code, survivors, reason) instead of the line")
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
	rep, err := stop.Cancel(d, stop.CancelOptions{Grace: time.Duration(grace), Wait: time.Duration(wait), PID: os.Getpid(), Diag: e.Stderr})
	if err != nil {
		e.errorf("%v", err)
		switch {
		case errors.Is(err, stop.ErrNoRecord):
			e.hint("nothing was signalled; 'agent-wrap reconcile %s' says what is known", d.ID)
		case errors.Is(err, stop.ErrRefused):
			e.hint("nothing was signalled; 'agent-wrap reconcile %s' explains the run's state", d.ID)
		case errors.Is(err, stop.ErrNotConfirmed):
			e.hint("check again with 'agent-wrap reconcile %s'", d.ID)
		default:
			e.hintHeld(err)
		}
		if *asJSON {
			e.printCancelAnswer(failedCancelAnswer(d.ID, rep, err))
		}
		return ExitFailure
	}
	for _, r := range rep.Rejected {
		e.errorf("run %s: %s", d.ID, r)
	}
	if rep.Already {
		a := answer.NewCancel(d.ID, answer.Already, rep.Record)
		code := ExitOK
		if rep.Record.SurvivorsUnknown() {
			a.Outcome, a.Reason = answer.NotConfirmed, "cleanup cannot be confirmed: "+survivorsUnknown
			e.errorf("run %s: %s", d.ID, a.Reason)
			code = ExitFailure
		}
		if *asJSON {
			e.printCancelAnswer(a)
		} else {
			e.printFinal(rep.Record, "already")
		}
		return code
	}
	return e.confirm(rep.Record, *asJSON)
}

// confirm prints the final record's summary (asJSON: as cancel --json's
// object): exit 0 when the run is terminal and nothing survived, 1
// otherwise.
func (e *Env) confirm(rec *statusfile.Record, asJSON bool) int {
	if !asJSON {
		e.printFinal(rec, "")
	}
	a := answer.NewCancel(rec.RunID, answer.Confirmed, rec)
	code := ExitOK
	if !statusfile.Terminal(rec.State) || len(rec.Survivors) > 0 {
		a.Outcome, a.Reason = answer.NotConfirmed, "the record is "+rec.State+", not terminal"
		if len(rec.Survivors) > 0 {
			a.Reason = fmt.Sprintf("cleanup not confirmed: %v outlived KILL", rec.Survivors)
			e.errorf("run %s: %s", rec.RunID, a.Reason)
		}
		code = ExitFailure
	}
	if rec.SurvivorsUnknown() {
		a.Outcome, a.Reason = answer.NotConfirmed, "cleanup cannot be confirmed: "+survivorsUnknown
		e.errorf("run %s: %s", rec.RunID, a.Reason)
		e.hint("'agent-wrap reconcile %s' lists what can be seen; a host with a writable cgroup v2 tree gives every run a boundary nothing leaves", rec.RunID)
		code = ExitFailure
	}
	if asJSON {
		e.printCancelAnswer(a)
	}
	return code
}

func (e *Env) printFinal(rec *statusfile.Record, already string) {
	if already != "" {
		already += " "
	}
	cause := ""
	if rec.Cause != "" {
		cause = " (cause " + rec.Cause + ")"
	}
	survivors := fmt.Sprint(rec.Survivors)
	if rec.SurvivorsUnknown() {
		survivors = "unknown"
	}
	fmt.Fprintf(e.Stdout, "%s: %s%s%s, exit code %d, survivors %s\n", rec.RunID, already, rec.State, cause, rec.Code(), survivors)
}

// survivorsUnknown is why a record under containment session cannot say
// that nothing survived.
const survivorsUnknown = "the run had no cgroup and was stopped from outside its wrapper, which sees only the job's session and the escapes the wrapper recorded; a process that left the session unrecorded cannot be seen"

func runRenew(e *Env, args []string) int {
	fs := e.flags("renew")
	var d durationValue
	fs.Var(&d, "lease", "new lease `D` from now (default: the run's own lease)")
	asJSON := fs.Bool("json", false, "one JSON line per run (the form for several RUN_IDs)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() == 0 {
		return e.usageError("renew takes a RUN_ID")
	}
	if *asJSON || fs.NArg() > 1 {
		return e.renewMany(fs.Args(), time.Duration(d))
	}
	root, dir, code := e.openRun(fs.Arg(0))
	if dir == nil {
		return code
	}
	defer root.Close()
	defer dir.Close()
	next, err := lease.Renew(dir, time.Duration(d))
	if cerr := completeJournal(dir); cerr != nil {
		e.errorf("%v (the next watchdog pass tries again)", cerr)
	}
	if err != nil {
		e.errorf("%v", err)
		if errors.Is(err, lease.ErrRefused) {
			e.hint("'agent-wrap status %s' shows the run; start a new run if the work must go on", dir.ID)
		}
		e.hintHeld(err)
		return ExitFailure
	}
	fmt.Fprintf(e.Stdout, "%s: deadline %d (%s)\n", dir.ID, next, time.Unix(next, 0).UTC().Format(time.RFC3339))
	return ExitOK
}

// completeJournal appends the final line that a stop could not journal
// while this renew, stuck, held the run's journal (stop.CompleteJournal),
// when the run turns out to be over.
func completeJournal(dir *rundir.Dir) error {
	_, err := stop.CompleteJournal(dir, "renew", stop.CompleteWait)
	return err
}

// hintHeld says what to do about a run's lock that was still held at the
// end of the wait (a *rundir.HeldError in err), if that is what err is.
func (e *Env) hintHeld(err error) {
	var held *rundir.HeldError
	if !errors.As(err, &held) {
		return
	}
	h, ok := held.Holder()
	switch {
	case ok && h.Stopped():
		e.hint("pid %d is stopped while it holds the run's lock: 'kill -CONT %d' lets it finish; past the run's lease the watchdog stops the run without the lock", h.PID, h.PID)
	case ok:
		e.hint("pid %d holds the run's lock; try again in a moment, and if it keeps it, look at what that process is doing (the watchdog stops the run past its lease without the lock)", h.PID)
	default:
		e.hint("try again in a moment; past the run's lease the watchdog stops the run without the lock")
	}
}
