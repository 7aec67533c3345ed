package membership

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Found is the run Find found holding a process, handed back as Find left
// it: its directory open and locked (rundir.Dir.Lock, the lock every state
// change is made under), and its record as read under that lock, by which
// the process was judged. A gateway deciding for the process needs no
// second open of the directory and no second read of the record. Close
// releases both.
type Found struct {
	ID     string
	Dir    *rundir.Dir
	Record *statusfile.Record
	// Member is the process as a member of the run (Run.Contains).
	Member Member

	pid       int
	start     uint64
	candidate func(*statusfile.Record) bool
	judged    bool // Record, read under the lock held now, holds pid
	unlock    func()
}

// Holds reports whether rec names pid (started at start) as one of the
// run's processes. For the record Find or Relock read under the lock held
// now, and the process it was asked about, that is the judgement already
// made; for anything else it is made anew. Its signature is a gateway's
// member check (authority.Member).
func (f *Found) Holds(rec *statusfile.Record, pid int, start uint64) bool {
	if rec == f.Record && pid == f.pid && start == f.start && f.unlock != nil {
		return f.judged
	}
	if rec == nil || !f.candidate(rec) {
		return false
	}
	_, err := Run{Record: rec}.Contains(pid, start)
	return err == nil
}

// Unlock releases the run's lock; the directory stays open.
func (f *Found) Unlock() {
	if f.unlock != nil {
		f.unlock()
		f.unlock = nil
	}
}

// Relock takes the run's lock again and reads the record again (for a
// caller that waits while the run is starting), judging the process anew.
// The error is the lock's or the read's; Record is nil after a failed read.
func (f *Found) Relock() error {
	f.Unlock()
	unlock, err := f.Dir.Lock()
	if err != nil {
		return err
	}
	f.unlock = unlock
	f.Record, f.judged = nil, false
	rec, err := statusfile.Read(f.Dir)
	if err != nil {
		return err
	}
	f.Record = rec
	if f.candidate(rec) {
		if m, err := (Run{Record: rec}).Contains(f.pid, f.start); err == nil {
			f.Member, f.judged = m, true
		}
	}
	return nil
}

// Close releases the lock and closes the directory.
func (f *Found) Close() error {
	f.Unlock()
	return f.Dir.Close()
}

// Find returns the run under root that holds the process at pid, seen by
// the caller with start time start (Run.Contains decides), open and locked
// (see Found). A run of any state may hold it: a process that outlived its
// run's final record is still that run's, and a gateway refuses it by the
// run's state.
//
// The run is looked for in the order of cost: the cgroup the process is in
// (a run cgroup names its run, see CgroupName: that run's directory opened
// once, locked, its record read once); else every record under root whose
// session is the process's, or whose recorded escapes or cgroup name it
// (one read of status.json per run, no process table, and for the run
// found one more read, under its lock). An error wrapping ErrNotMember
// means no run holds the process (or it is gone, or has another start
// time); nothing is left open or locked then.
func Find(root *rundir.Root, pid int, start uint64) (*Found, error) {
	st, err := proc.ReadStat(pid)
	switch {
	case errors.Is(err, proc.ErrGone):
		return nil, fmt.Errorf("pid %d: %w: gone", pid, ErrNotMember)
	case err != nil:
		return nil, err
	case start == 0 || st.Start != start:
		return nil, fmt.Errorf("pid %d: %w: started at tick %d, not %d", pid, ErrNotMember, st.Start, start)
	}
	cg := cgroupOf(pid)
	tried := ""
	if cg != "" && cgroup.Valid(cg) {
		if cid, wpid, ok := runOfCgroup(filepath.Base(cg)); ok && rundir.ValidID(cid) == nil {
			named := func(rec *statusfile.Record) bool { return rec.WrapperPID == wpid }
			if f, err := tryRun(root, cid, pid, start, named, true); err == nil {
				return f, nil
			}
			tried = cid
		}
	}
	ids, err := root.List()
	if err != nil {
		return nil, err
	}
	holds := func(rec *statusfile.Record) bool {
		if rec.SID > 1 && rec.SID == st.SID || rec.Cgroup != "" && rec.Cgroup == cg {
			return true
		}
		for _, e := range rec.Escaped {
			if e.PID == pid {
				return true
			}
		}
		return false
	}
	for _, cid := range ids {
		if cid == tried {
			continue
		}
		if f, err := tryRun(root, cid, pid, start, holds, false); err == nil {
			return f, nil
		}
	}
	return nil, fmt.Errorf("pid %d: %w: no run under %s holds it", pid, ErrNotMember, root.Path)
}

// tryRun asks run id whether it holds pid, if its record is a candidate,
// and hands it back locked when it does. lockFirst: the run is the one
// candidate (its cgroup named it), so the lock is taken before the one
// read; else the record is read first and, for a candidate, read again
// under the lock.
func tryRun(root *rundir.Root, id string, pid int, start uint64, candidate func(*statusfile.Record) bool, lockFirst bool) (*Found, error) {
	d, err := root.Open(id)
	if err != nil {
		return nil, err
	}
	f := &Found{ID: id, Dir: d, pid: pid, start: start, candidate: candidate}
	if !lockFirst {
		rec, err := statusfile.Read(d)
		if err != nil {
			d.Close()
			return nil, err
		}
		if !candidate(rec) {
			d.Close()
			return nil, ErrNotMember
		}
	}
	if err := f.Relock(); err != nil {
		f.Close()
		return nil, err
	}
	if !f.judged {
		f.Close()
		return nil, ErrNotMember
	}
	return f, nil
}
