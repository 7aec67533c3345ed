//go:build linux

package cli

import (
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func init() {
	register(&command{
		name:     "wait",
		summary:  "wait for a run to end and exit with its code",
		synopsis: "wait [--timeout D] RUN_ID",
		help:     waitHelp,
		exits:    "as run would have exited for this run; 75 --timeout passed or the outcome is unknown; 66 no such run; 64 usage; 78 unsafe run root",
		run:      runWait,
	})
}

const waitHelp = `wait blocks until the run is terminal and exits as run would have: the
record's exit_code (the job's code, 128+N, 143/130/129 cancelled, 124 lease
expired, 127/126/70 launch failed).

It exits 75 with a message on stderr, and without waiting further, when
  - --timeout passes first (the run is still live), or
  - the outcome is unknown: the run is not terminal but its wrapper is dead
    and nothing of it is alive (or the host rebooted, or the record is
    unreadable) for a few seconds on end. Nothing will ever finish such a run
    but 'agent-wrap cancel'; 'agent-wrap reconcile' says what is known.
75 is what running the same ID again would return for a live or unknown run.
`

// unknownSettle is how long an unknown verdict must hold before wait and
// logs -f give up on a run. A run whose wrapper is gone is briefly unknown
// while cancel or the watchdog, having stopped its group, write its final
// record; this covers that, and a record that is missing only because the
// wrapper is about to write its first one.
const unknownSettle = 3 * time.Second

// judgeEvery is how often a follower re-judges a non-terminal run whose
// wrapper it could not pin (its wrapper's /proc entry; a process scan only
// when the wrapper is gone); the record itself is re-read on every wake-up.
const judgeEvery = time.Second

// lookEvery is how long a follower sleeps, at most, while it cannot pin the
// run's wrapper: the record or the logs changing wake it sooner.
const lookEvery = 250 * time.Millisecond

// pinnedBackstop is how long a follower sleeps, at most, while the run's
// wrapper is pinned and nothing in the run directory changes. A replaced
// record, a write to a log (logs -f, attach) and the wrapper's exit each
// wake it at once, so a quiet run costs its followers no wake-ups; the
// backstop is for a change inotify does not report.
const pinnedBackstop = 30 * time.Second

// follower watches one run until its record is terminal or its outcome has
// been unknown for unknownSettle.
type follower struct {
	d            *rundir.Dir
	w            *rundir.Watcher
	wrapper      *proc.Pinned  // the record's wrapper, alive and checked when pinned; nil: not pinned
	pinTried     proc.Identity // the wrapper last tried, so a gone one is tried once
	lastJudged   time.Time
	unknownSince time.Time
}

// newFollower: logs says whether the follower also wakes on writes to the
// logs (logs -f) or only on a replaced record (wait).
func newFollower(d *rundir.Dir, logs bool) *follower {
	if logs {
		return &follower{d: d, w: d.WatchLogs()}
	}
	return &follower{d: d, w: d.Watch()}
}

func (f *follower) Close() {
	f.w.Close()
	if f.wrapper != nil {
		f.wrapper.Close()
	}
}

// poll looks once. It returns the terminal record, or a verdict when the
// outcome has been unknown for unknownSettle, or neither.
func (f *follower) poll() (*statusfile.Record, *reconcile.Verdict) {
	rec, err := statusfile.Read(f.d)
	if err == nil && statusfile.Terminal(rec.State) {
		return rec, nil
	}
	if err == nil {
		f.pin(rec)
	}
	if f.wrapper != nil && !f.wrapper.Exited() {
		// The record's wrapper runs (pinned after its start time was
		// checked): the run is live, and its end will be a new record.
		f.unknownSince = time.Time{}
		return nil, nil
	}
	now := time.Now()
	if now.Sub(f.lastJudged) < judgeEvery {
		return nil, nil
	}
	f.lastJudged = now
	// GatherOutcome, not Gather: a live run's outcome is its wrapper's
	// /proc entry, not a scan of every process on the host. Hundreds of
	// attaches (a fan-out of runs to one host) each scanning the whole
	// process table every judgeEvery cost N scans of N processes a second:
	// at 200 runs, the two CPUs of the test machine, and the controllers'
	// launches starved behind them.
	v := reconcile.Decide(reconcile.GatherOutcome(f.d))
	if v.Evidence.ExitCode != nil {
		// Terminal since the read above.
		if rec, err := statusfile.Read(f.d); err == nil && statusfile.Terminal(rec.State) {
			return rec, nil
		}
	}
	if v.Outcome != reconcile.Unknown {
		f.unknownSince = time.Time{}
		return nil, nil
	}
	if f.unknownSince.IsZero() {
		f.unknownSince = now
	}
	if now.Sub(f.unknownSince) >= unknownSettle {
		return nil, &v
	}
	return nil, nil
}

// pin holds the record's wrapper by a pidfd, if it is this boot's, alive,
// and the process the record names (its start time). Each wrapper is tried
// once: one that is gone is left to the judge.
func (f *follower) pin(rec *statusfile.Record) {
	id := proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}
	if f.wrapper != nil || id == f.pinTried || id.PID <= 1 || id.Start == 0 {
		return
	}
	f.pinTried = id
	if boot, err := proc.BootID(); err != nil || boot != rec.BootID {
		return
	}
	if p, err := proc.Pin(id); err == nil {
		f.wrapper = p
	}
}

// sleep waits for a change in the run directory or the pinned wrapper's
// exit: at most limit (0: no limit of the caller's), lookEvery while no
// wrapper is pinned, pinnedBackstop while one is. Under logs -f a job that
// writes its log without pause wakes the watcher at every re-arm; wake-ups
// are spaced at least minNap apart so following it costs little. (For its
// first second the watcher has no inotify watch and looks at growing
// intervals instead: see rundir.Watcher.)
func (f *follower) sleep(limit time.Duration) {
	const minNap = 20 * time.Millisecond
	d, also := lookEvery, -1
	if f.wrapper != nil && !f.wrapper.Exited() {
		d, also = pinnedBackstop, f.wrapper.FD()
	}
	if limit > 0 && limit < d {
		d = limit
	}
	start := time.Now()
	if f.w.WaitAlso(d, also) {
		return // the wrapper exited: look at once
	}
	// Before its watch is set up the watcher spaces its looks itself.
	if took := time.Since(start); f.w.Armed() && took < minNap && took < d {
		time.Sleep(min(minNap, d) - took)
	}
}

func runWait(e *Env, args []string) int {
	fs := e.flags("wait")
	var timeout durationValue
	fs.Var(&timeout, "timeout", "give up after `D` and exit 75; 0 waits as long as the run lives")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("wait takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()

	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(time.Duration(timeout))
	}
	f := newFollower(d, false)
	defer f.Close()
	for {
		rec, v := f.poll()
		if rec != nil {
			return rec.Code()
		}
		if v != nil {
			e.errorf("run %s: outcome unknown: %s", d.ID, v.Reason)
			e.hint("nothing will finish this run by itself; 'agent-wrap reconcile %s' shows the evidence, 'agent-wrap cancel %s' records a final state", d.ID, d.ID)
			return ExitTempFail
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			state := "not terminal"
			if r, err := statusfile.Read(d); err == nil {
				state = r.State
			}
			e.errorf("run %s: still %s after %v; stopped waiting (the run goes on)", d.ID, state, time.Duration(timeout))
			return ExitTempFail
		}
		var limit time.Duration // none: the follower's own
		if !deadline.IsZero() {
			limit = max(time.Until(deadline), time.Millisecond)
		}
		f.sleep(limit)
	}
}
