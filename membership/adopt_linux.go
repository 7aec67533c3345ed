package membership

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Leader is the identity of a run's job found by StartingLeader.
type Leader struct {
	PID   int    // the job's leader, PID == PGID == SID
	Start uint64 // its start time, or the wrapper's when nothing is at PID any more
	// Cgroup is the run cgroup the leader is in, when the record names
	// none and the leader's own cgroup is the one its wrapper made for the
	// run (see CgroupName); "" otherwise.
	Cgroup string
}

// StartingLeader finds the job of a run whose record names no process
// group because its wrapper died while starting it: after the fork and
// before the `running` record. The pid file (or, before it is written, a
// session leader in the run's cgroup) is a claim, taken only when it still
// makes sense: the process at that PID is a session leader (PID == PGID ==
// SID) that started no earlier than the wrapper, alive or a zombie; or
// nothing is at that PID any more, and its group members are then to be
// validated against the wrapper's start time instead of the leader's
// (Leader.Start). A PID now used by anything else is no leader: ok is
// false. The caller has checked that the record is from this boot.
func StartingLeader(d *rundir.Dir, rec *statusfile.Record) (l Leader, ok bool) {
	if rec.PGID > 1 || rec.State != statusfile.Starting || rec.WrapperStart == 0 {
		return l, false
	}
	pid := 0
	// The pid file is written in one write of "PID\n"; a wrapper killed
	// between creating it and that write leaves it empty, which says as
	// little as no file at all.
	if b, err := d.ReadFile(rundir.PIDFile); err == nil && strings.HasSuffix(string(b), "\n") {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if pid <= 1 {
		if cg := startingCgroup(rec); cg != "" {
			// No pid yet, but the run's cgroup: the job is the session
			// leader in it that started first.
			pid = firstSessionLeader(cg, rec.WrapperStart)
		}
	}
	if pid <= 1 {
		return l, false
	}
	l = Leader{PID: pid, Start: rec.WrapperStart}
	st, err := proc.ReadStat(pid)
	switch {
	case err == nil && st.PGID == pid && st.SID == pid && st.Start >= rec.WrapperStart:
		l.Start = st.Start
	case err == nil:
		return Leader{}, false // the PID is someone else's now
	}
	if err == nil && rec.Cgroup == "" {
		// The leader's own cgroup, if it is the one its wrapper made for
		// the run, holds every descendant, escaped or not.
		l.Cgroup = runCgroupOf(pid, CgroupName(rec.RunID, rec.WrapperPID))
	}
	return l, true
}

// firstSessionLeader returns the session leader (PID == PGID == SID) in
// cgroup cg that started first, no earlier than the wrapper (minStart), or
// 0. The job's leader is the first process in the run's cgroup; a
// descendant that called setsid is a session leader too, but started after
// it (in the same clock tick at worst, and then with a higher PID, short of
// a PID wrap-around within that tick).
func firstSessionLeader(cg string, minStart uint64) int {
	procs, _ := cgroup.Procs(cg)
	best, bestStart := 0, uint64(0)
	for _, p := range procs {
		st, err := proc.ReadStat(p)
		if err != nil || st.PGID != p || st.SID != p || st.Start < minStart {
			continue
		}
		if best == 0 || st.Start < bestStart || (st.Start == bestStart && p < best) {
			best, bestStart = p, st.Start
		}
	}
	return best
}

// startingCgroup returns the cgroup of a run whose wrapper died before its
// record moved past starting: the one the record names (a wrapper that
// records it before the fork), else the one the wrapper would have made
// below our own cgroup, named RUN_ID.WRAPPER_PID, if it exists (the watchdog
// or cancel run in the wrapper's cgroup, as from the same login or unit).
func startingCgroup(rec *statusfile.Record) string {
	if rec.Cgroup != "" {
		if cgroup.Valid(rec.Cgroup) {
			return rec.Cgroup
		}
		return ""
	}
	mnt, err := cgroup.Mount()
	if err != nil {
		return ""
	}
	self, err := cgroup.Self()
	if err != nil {
		return ""
	}
	p := filepath.Join(mnt, self, cgroup.Parent, CgroupName(rec.RunID, rec.WrapperPID))
	if _, err := os.Stat(p); err != nil || !cgroup.Valid(p) {
		return ""
	}
	return p
}
