package bench

import (
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Fixture writes synthetic run directories that every reader of a run root
// accepts: status.json through statusfile.Marshal, pid, pgid,
// deadline_epoch, empty logs and lock, and a hash-chained events.jsonl
// through journal.Append. Nothing is fsynced: the fixture is data to be
// scanned, not a record to survive a crash, and 50,000 fsyncs would take
// minutes here.
//
// Live runs are `running` with a deadline an hour ahead; their pid, pgid and
// sid name Leader (a real process alone in its session, started by the
// caller) and their wrapper_pid names Wrapper (another real process), both
// with their true start times, so a reader that validates identities finds
// them alive and matching. No agent-wrap supervises them: a watchdog must
// leave them alone because their lease has not passed.
//
// Finished runs are `finished`, exit 0, with a deadline an hour in the past:
// the runs `gc` could remove, which a watchdog must skip without looking at
// any process. Their pid names Dead, a process that has exited and been
// reaped.
type Fixture struct {
	Root    *rundir.Root
	BootID  string
	Leader  proc.Stat
	Wrapper proc.Stat
	Dead    proc.Stat
}

// Write creates the runs prefix-<from> ... prefix-<to-1>, live or finished.
func (fx *Fixture) Write(prefix string, from, to int, live bool) error {
	now := time.Now()
	for i := from; i < to; i++ {
		id := prefix + "-" + strconv.Itoa(i)
		if err := fx.writeRun(id, live, now); err != nil {
			return err
		}
	}
	return nil
}

func (fx *Fixture) writeRun(id string, live bool, now time.Time) error {
	d, err := fx.Root.Create(id)
	if err != nil {
		return err
	}
	defer d.Close()
	leader, wrapper := fx.Dead, fx.Dead
	if live {
		leader, wrapper = fx.Leader, fx.Wrapper
	}
	created := now.Add(-time.Hour)
	deadline := lease.DeadlineAfter(created, 5*time.Minute)
	if live {
		created = now.Add(-time.Minute)
		deadline = lease.DeadlineAfter(now, time.Hour)
	}
	rec := statusfile.Record{
		Schema:       statusfile.Schema,
		RunID:        id,
		State:        statusfile.Running,
		PID:          leader.PID,
		PGID:         leader.PID,
		SID:          leader.PID,
		WrapperPID:   wrapper.PID,
		LeaderStart:  leader.Start,
		WrapperStart: wrapper.Start,
		BootID:       fx.BootID,
		Command:      []string{"sleep", "3600"},
		CreatedAt:    statusfile.Timestamp(created),
		StartedAt:    statusfile.Timestamp(created.Add(2 * time.Millisecond)),
		LeaseSeconds: 300,
		GraceSeconds: 5,
		OnHangup:     "cancel",
		Boundary:     "session+subreaper",
	}
	if live {
		rec.LeaseSeconds = 3600
	} else {
		rec.State = statusfile.Finished
		rec.SetExit(0)
		rec.EndedAt = statusfile.Timestamp(created.Add(time.Second))
		rec.Survivors = []int{}
	}
	pidLine := []byte(strconv.Itoa(leader.PID) + "\n")
	if _, err := journal.Append(d, "created", journal.Fields{"wrapper_pid": wrapper.PID, "wrapper_start": wrapper.Start,
		"lease_seconds": rec.LeaseSeconds, "grace_seconds": rec.GraceSeconds, "boundary": rec.Boundary}, false); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		b    []byte
	}{
		{rundir.StdoutFile, nil},
		{rundir.StderrFile, nil},
		{rundir.LockFile, nil},
		{rundir.PIDFile, pidLine},
		{rundir.PGIDFile, pidLine},
		{rundir.DeadlineFile, lease.FormatDeadline(deadline)},
	} {
		if err := writeFile(d, f.name, f.b); err != nil {
			return err
		}
	}
	if _, err := journal.Append(d, "started", journal.Fields{"pid": leader.PID, "pgid": leader.PID, "sid": leader.PID,
		"leader_start": leader.Start, "deadline_epoch": deadline}, false); err != nil {
		return err
	}
	if !live {
		if _, err := journal.Append(d, "final", journal.Fields{"state": rec.State, "exit_code": 0, "survivors": []int{}}, false); err != nil {
			return err
		}
	}
	b, err := statusfile.Marshal(&rec)
	if err != nil {
		return err
	}
	return writeFile(d, rundir.StatusFile, b)
}

func writeFile(d *rundir.Dir, name string, b []byte) error {
	f, err := d.OpenFile(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadAllStatus is the watchdog's floor: open the root, list it, and read
// and parse every run's status.json once, as statusfile.Read does. It
// returns how many records parsed and the first error.
func ReadAllStatus(root string) (int, error) {
	r, err := rundir.OpenRoot(root, false)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	ids, err := r.List()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		d, err := r.Open(id)
		if err != nil {
			return n, err
		}
		_, err = statusfile.Read(d)
		d.Close()
		if err != nil {
			return n, fmt.Errorf("%s: %w", id, err)
		}
		n++
	}
	return n, nil
}
