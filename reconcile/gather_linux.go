package reconcile

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// lockWait is how long Gather waits for a shared hold on the run's lock, so
// that it never reads a record in the middle of a state transition. When
// another process (cancel's or the watchdog's stop, say) holds it longer,
// Gather reads without it and says so (Input.LockBusy).
const lockWait = time.Second

// Gather collects the evidence about the run in d from its files and the
// real /proc. It only reads: the lock is taken shared, through a read-only
// descriptor, and only when the lock file exists.
//
// The record is read again after the processes were looked at; if it moved
// on meanwhile (the wrapper wrote its final record and exited between the
// two looks, say), the evidence is gathered again, so a verdict never mixes
// an old record with newer processes.
func Gather(d *rundir.Dir) Input { return gather(d, true, scanNow) }

// GatherOutcome is Gather for a caller that needs the outcome, not all the
// evidence (list): the process table is read only where the outcome
// depends on it, for a cancelled run and for one whose wrapper is gone. A
// run whose wrapper is alive (it is running, whatever its members) and a
// finished one cost their files and one look at the wrapper's /proc
// entry, not a scan of every process on the host, so listing N live runs
// is not N scans of N processes. Members and Rejected are empty for them;
// Decide gives the same outcome and supervisor as it would from Gather.
// The record is read again after the processes only when they were
// scanned: a record read before its wrapper was seen alive was the run's
// state while the wrapper lived, and a terminal one never changes.
//
// Those two cases are also judged without the run's lock: each file is
// replaced whole (a reader sees the old content or the new), so a record
// read without it is a state the run was in, the wrapper seen alive after
// it proves that state live, and a finished record is final. Waiting for
// a transition under way to end (the lock) would change neither outcome
// nor supervisor; it would only make list wait up to a second for every
// run a cancel or a watchdog is stopping. Every other case (a cancelled
// run, a wrapper gone, a record unreadable, another boot) is gathered
// under the shared lock as Gather does.
func GatherOutcome(d *rundir.Dir) Input {
	if in, ok := gatherLive(d); ok {
		return in
	}
	return gather(d, false, scanNow)
}

// GatherOutcomeFirst is GatherOutcome for a caller that judges many runs
// (list over a root): where the outcome depends on the run's members (a
// cancelled run, a wrapper gone), it does not read the process table but
// returns needsTable. The caller then reads the table once (proc.Scan),
// after the first look at every such run, and calls GatherOutcomeWith for
// each of them: N cancelled runs cost one read of the table, not N. An
// Input with needsTable set is not to be decided on.
func GatherOutcomeFirst(d *rundir.Dir) (in Input, needsTable bool) {
	if in, ok := gatherLive(d); ok {
		return in, false
	}
	in = gather(d, false, func(*statusfile.Record) ([]proc.Stat, error) { return nil, errDeferred })
	return in, errors.Is(in.MembersErr, errDeferred)
}

// GatherOutcomeWith finishes what GatherOutcomeFirst began (first) with
// table, a read of the process table made after first was gathered: the
// record is read again, and while it says what first's said (the same
// state, cause, wrapper and group) the run's members are judged in table,
// which was then read between two looks that saw the same run. A record
// that moved on since, or a nil table, is judged on a read of its own.
func GatherOutcomeWith(d *rundir.Dir, first Input, table []proc.Stat) Input {
	return gather(d, false, func(rec *statusfile.Record) ([]proc.Stat, error) {
		if table != nil && first.Record != nil && sameState(first.Record, nil, rec, nil) {
			return table, nil
		}
		return proc.Scan()
	})
}

// errDeferred stands for the process table GatherOutcomeFirst leaves to
// its caller.
var errDeferred = errors.New("the process table is read once for every run listed")

// scan returns a process table in which to judge the members of the run
// whose record is rec; scanNow reads it now.
type scan func(rec *statusfile.Record) ([]proc.Stat, error)

func scanNow(*statusfile.Record) ([]proc.Stat, error) { return proc.Scan() }

// gatherLive is GatherOutcome's look without the lock: ok when the run's
// wrapper is alive and its record not terminal, or the record is finished
// or launch_failed.
func gatherLive(d *rundir.Dir) (in Input, ok bool) {
	in = Input{RunID: d.ID, Now: time.Now()}
	if dl, err := lease.ReadDeadline(d); err == nil {
		in.Deadline = dl
	} else if !errors.Is(err, lease.ErrNoDeadline) {
		return in, false
	}
	rec, err := statusfile.Read(d)
	if err != nil {
		return in, false
	}
	in.Record = rec
	if rec.State == statusfile.Finished || rec.State == statusfile.LaunchFailed {
		// Final: the wrapper's liveness only says whether it still drains
		// its streams (supervisor alive, not none).
		boot, err := proc.BootID()
		if err != nil {
			return in, false
		}
		in.BootChanged = rec.BootID != boot
		in.WrapperAlive = !in.BootChanged && membership.WrapperAlive(rec)
		return in, true
	}
	if statusfile.Terminal(rec.State) {
		return in, false
	}
	in.WrapperAlive = membership.WrapperAlive(rec)
	return in, in.WrapperAlive
}

func gather(d *rundir.Dir, full bool, table scan) Input {
	unlock, busy := d.RLock(lockWait)
	defer unlock()
	var in Input
	for attempt := 0; attempt < 3; attempt++ {
		var reread bool
		in, reread = gatherOnce(d, full, table)
		in.LockBusy = busy
		if !reread {
			break
		}
		again, err := statusfile.Read(d)
		if sameState(in.Record, in.RecordErr, again, err) {
			break
		}
	}
	return in
}

func sameState(a *statusfile.Record, aerr error, b *statusfile.Record, berr error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil && (aerr == nil) == (berr == nil)
	}
	return a.State == b.State && a.Cause == b.Cause && a.WrapperPID == b.WrapperPID && a.PGID == b.PGID
}

// gatherOnce gathers the evidence once; reread says whether the record must
// be read again to know it did not move on while the processes were looked
// at: always, but where GatherOutcome skipped the look.
func gatherOnce(d *rundir.Dir, full bool, table scan) (in Input, reread bool) {
	in = Input{RunID: d.ID, Now: time.Now()}
	if dl, err := lease.ReadDeadline(d); err == nil {
		in.Deadline = dl
	} else if !errors.Is(err, lease.ErrNoDeadline) {
		in.DeadlineErr = err
	}
	rec, err := statusfile.Read(d)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			err = fmt.Errorf("%s/%s is missing (the run may be starting, or its wrapper died before writing its first record)", d.Path, rundir.StatusFile)
		}
		in.RecordErr = err
		return in, true
	}
	in.Record = rec
	boot, err := proc.BootID()
	if err != nil {
		in.MembersErr = fmt.Errorf("cannot read this boot's ID: %w", err)
		return in, true
	}
	if rec.BootID != boot {
		in.BootChanged = true
		return in, true
	}
	in.WrapperAlive = membership.WrapperAlive(rec)
	if !full && (in.WrapperAlive && !statusfile.Terminal(rec.State) || rec.State == statusfile.Finished || rec.State == statusfile.LaunchFailed) {
		return in, false // the outcome does not depend on the members
	}
	judged := rec
	err = membership.Check(rec)
	if errors.Is(err, membership.ErrNoGroup) {
		// The wrapper died before it recorded the job: the pid file or
		// the run's cgroup may still name it (what a stop would adopt).
		if l, ok := membership.StartingLeader(d, rec); ok {
			c := *rec
			c.PID, c.PGID, c.SID, c.LeaderStart = l.PID, l.PID, l.PID, l.Start
			if l.Cgroup != "" {
				c.Cgroup, c.Boundary = l.Cgroup, membership.BoundaryCgroup
			}
			judged, err = &c, membership.Check(&c)
		}
	}
	switch {
	case errors.Is(err, membership.ErrNoGroup):
		return in, true // never got a process group: nothing to look for
	case err != nil:
		in.MembersErr = err
		return in, true
	}
	all, err := table(judged)
	if err != nil {
		in.MembersErr = fmt.Errorf("cannot read the process table: %w", err)
		return in, true
	}
	run := membership.Run{Record: judged}
	if !statusfile.Terminal(judged.State) {
		// A live record whose wrapper is gone: what holds the run's logs
		// is the run's, as for the stop that would end it. A terminal
		// record's verdict does not need it (see Decide), and a root of
		// many ended runs is not read twice over for it.
		run.Logs = membership.LogsOf(d)
	}
	targets, rejected := run.Judge(all)
	in.Rejected = rejected
	for _, t := range targets {
		in.Members = append(in.Members, Member{PID: t.PID, PGID: t.PGID, SID: t.SID,
			State: string(rune(t.State)), Comm: t.Comm, Escaped: t.Escaped})
	}
	return in, true
}
