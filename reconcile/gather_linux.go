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
func Gather(d *rundir.Dir) Input {
	unlock, busy := d.RLock(lockWait)
	defer unlock()
	var in Input
	for attempt := 0; attempt < 3; attempt++ {
		in = gatherOnce(d)
		in.LockBusy = busy
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

func gatherOnce(d *rundir.Dir) Input {
	in := Input{RunID: d.ID, Now: time.Now()}
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
		return in
	}
	in.Record = rec
	boot, err := proc.BootID()
	if err != nil {
		in.MembersErr = fmt.Errorf("cannot read this boot's ID: %w", err)
		return in
	}
	if rec.BootID != boot {
		in.BootChanged = true
		return in
	}
	in.WrapperAlive = membership.WrapperAlive(rec)
	switch err := membership.Check(rec); {
	case errors.Is(err, membership.ErrNoGroup):
		return in // never got a process group: nothing to look for
	case err != nil:
		in.MembersErr = err
		return in
	}
	targets, rejected, err := membership.Run{Record: rec}.Members()
	if err != nil {
		in.MembersErr = fmt.Errorf("cannot read the process table: %w", err)
		return in
	}
	in.Rejected = rejected
	for _, t := range targets {
		in.Members = append(in.Members, Member{PID: t.PID, PGID: t.PGID, SID: t.SID,
			State: string(rune(t.State)), Comm: t.Comm, Escaped: t.Escaped})
	}
	return in
}
