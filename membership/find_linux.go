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

// Find returns the ID of the run under root that holds the process at pid,
// seen by the caller with start time start, and the process as a member of
// it (Run.Contains decides). A run of any state may hold it: a process that
// outlived its run's final record is still that run's, and a gateway
// refuses it by the run's state.
//
// The run is looked for in the order of cost: the cgroup the process is in
// (a run cgroup names its run, see CgroupName: one run read); else every
// record under root whose session is the process's, or whose recorded
// escapes or cgroup name it (one read of status.json per run, no process
// table). An error wrapping ErrNotMember means no run holds the process
// (or it is gone, or has another start time).
func Find(root *rundir.Root, pid int, start uint64) (id string, m Member, err error) {
	st, err := proc.ReadStat(pid)
	switch {
	case errors.Is(err, proc.ErrGone):
		return "", Member{}, fmt.Errorf("pid %d: %w: gone", pid, ErrNotMember)
	case err != nil:
		return "", Member{}, err
	case start == 0 || st.Start != start:
		return "", Member{}, fmt.Errorf("pid %d: %w: started at tick %d, not %d", pid, ErrNotMember, st.Start, start)
	}
	cg := cgroupOf(pid)
	tried := ""
	if cg != "" && cgroup.Valid(cg) {
		if cid, wpid, ok := runOfCgroup(filepath.Base(cg)); ok && rundir.ValidID(cid) == nil {
			if m, err := tryRun(root, cid, pid, start, func(rec *statusfile.Record) bool { return rec.WrapperPID == wpid }); err == nil {
				return cid, m, nil
			}
			tried = cid
		}
	}
	ids, err := root.List()
	if err != nil {
		return "", Member{}, err
	}
	for _, cid := range ids {
		if cid == tried {
			continue
		}
		m, err := tryRun(root, cid, pid, start, func(rec *statusfile.Record) bool {
			if rec.SID > 1 && rec.SID == st.SID || rec.Cgroup != "" && rec.Cgroup == cg {
				return true
			}
			for _, e := range rec.Escaped {
				if e.PID == pid {
					return true
				}
			}
			return false
		})
		if err == nil {
			return cid, m, nil
		}
	}
	return "", Member{}, fmt.Errorf("pid %d: %w: no run under %s holds it", pid, ErrNotMember, root.Path)
}

// tryRun asks run id whether it holds pid, if its record is a candidate.
func tryRun(root *rundir.Root, id string, pid int, start uint64, candidate func(*statusfile.Record) bool) (Member, error) {
	d, err := root.Open(id)
	if err != nil {
		return Member{}, err
	}
	defer d.Close()
	rec, err := statusfile.Read(d)
	if err != nil {
		return Member{}, err
	}
	if !candidate(rec) {
		return Member{}, ErrNotMember
	}
	return Run{Record: rec}.Contains(pid, start)
}
