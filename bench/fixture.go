package bench

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
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
// deadline_epoch, empty logs, and a hash-chained events.jsonl
// made by journal.Append. Nothing is fsynced: the fixture is data to be
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

// Write creates the runs prefix-<from> ... prefix-<to-1>, live or finished,
// with one writer per CPU.
func (fx *Fixture) Write(prefix string, from, to int, live bool) error {
	now := time.Now()
	events, err := fx.journal(live, now)
	if err != nil {
		return err
	}
	workers := runtime.NumCPU()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from + w; i < to; i += workers {
				id := prefix + "-" + strconv.Itoa(i)
				if err := fx.writeRun(id, live, now, events); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// times are the fixture's timestamps and deadline for a live or finished run.
func times(live bool, now time.Time) (created time.Time, deadline int64) {
	if live {
		return now.Add(-time.Minute), lease.DeadlineAfter(now, time.Hour)
	}
	created = now.Add(-time.Hour)
	return created, lease.DeadlineAfter(created, 5*time.Minute)
}

// journal returns the events.jsonl of a live or finished run. The events
// name no run ID, so one journal, made by journal.Append in a scratch run,
// serves every run of a kind: a 50,000-run fixture then costs a few files
// per run instead of three locked appends.
func (fx *Fixture) journal(live bool, now time.Time) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "awbench-journal-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	r, err := rundir.OpenRoot(tmp, false)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	d, err := r.Create("template")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	leader, wrapper := fx.Dead, fx.Dead
	lsec := 300.0
	if live {
		leader, wrapper, lsec = fx.Leader, fx.Wrapper, 3600
	}
	_, deadline := times(live, now)
	events := []struct {
		name string
		f    journal.Fields
	}{
		{"created", journal.Fields{"wrapper_pid": wrapper.PID, "wrapper_start": wrapper.Start,
			"lease_seconds": lsec, "grace_seconds": 5, "boundary": "session+subreaper"}},
		{"started", journal.Fields{"pid": leader.PID, "pgid": leader.PID, "sid": leader.PID,
			"leader_start": leader.Start, "deadline_epoch": deadline}},
	}
	if !live {
		events = append(events, struct {
			name string
			f    journal.Fields
		}{"final", journal.Fields{"state": statusfile.Finished, "exit_code": 0, "survivors": []int{}}})
	}
	for _, e := range events {
		if _, err := journal.Append(d, e.name, e.f, false); err != nil {
			return nil, err
		}
	}
	return d.ReadFile(rundir.EventsFile)
}

func (fx *Fixture) writeRun(id string, live bool, now time.Time, events []byte) error {
	d, err := fx.Root.Create(id)
	if err != nil {
		return err
	}
	defer d.Close()
	leader, wrapper := fx.Dead, fx.Dead
	if live {
		leader, wrapper = fx.Leader, fx.Wrapper
	}
	created, deadline := times(live, now)
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
	b, err := statusfile.Marshal(&rec)
	if err != nil {
		return err
	}
	pidLine := []byte(strconv.Itoa(leader.PID) + "\n")
	for _, f := range []struct {
		name string
		b    []byte
	}{
		{rundir.EventsFile, events},
		{rundir.StdoutFile, nil},
		{rundir.StderrFile, nil},
		{rundir.PIDFile, pidLine},
		{rundir.PGIDFile, pidLine},
		{rundir.DeadlineFile, lease.FormatDeadline(deadline)},
		{rundir.StatusFile, b},
	} {
		if err := writeFile(d, f.name, f.b); err != nil {
			return err
		}
	}
	return nil
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
