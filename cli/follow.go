//go:build linux

// Following a run until it is over, shared by wait, logs -f and attach:
// the follower (the record, the pinned wrapper, the judge when it is gone)
// and the log readers logs -f and attach copy through it.

package cli

import (
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

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

// followLogs copies each log to its writer as it grows until the run is
// terminal (returning its final record, with every log copied to its end)
// or its outcome has been unknown for unknownSettle (returning the verdict,
// with what there is copied). A read or write error ends it with neither,
// printed, and the exit code to return. logs -f and attach share it.
func followLogs(e *Env, d *rundir.Dir, logs ...*logReader) (*statusfile.Record, *reconcile.Verdict, int) {
	fo := newFollower(d, true)
	defer fo.Close()
	copyAll := func() int {
		for _, l := range logs {
			if err := l.copy(); err != nil {
				return l.fail(err)
			}
		}
		return 0
	}
	for {
		if code := copyAll(); code != 0 {
			return nil, nil, code
		}
		rec, v := fo.poll()
		if rec != nil || v != nil {
			// Terminal: the group has been stopped before the final
			// record was written, so what is in the files now is all.
			if code := copyAll(); code != 0 {
				return nil, nil, code
			}
			return rec, v, 0
		}
		fo.sleep(0)
	}
}

// logReader copies a log file to stdout from where it last stopped, opening
// it once it exists.
type logReader struct {
	e    *Env
	d    *rundir.Dir
	name string
	w    io.Writer
	from int64 // where to start reading, once the file is opened
	f    *os.File
}

func (l *logReader) copy() error {
	if l.f == nil {
		f, err := l.d.OpenFile(l.name, unix.O_RDONLY, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil // not yet: the job has not started
			}
			return err
		}
		if l.from > 0 {
			if _, err := f.Seek(l.from, io.SeekStart); err != nil {
				f.Close()
				return err
			}
		}
		l.f = f
	}
	_, err := io.Copy(l.w, l.f)
	return err
}

func (l *logReader) fail(err error) int {
	l.e.errorf("run %s: %s: %v", l.d.ID, l.name, err)
	if errors.Is(err, rundir.ErrUnsafe) {
		return ExitUnsafeRoot
	}
	return ExitFailure
}

func (l *logReader) close() {
	if l.f != nil {
		l.f.Close()
	}
}
