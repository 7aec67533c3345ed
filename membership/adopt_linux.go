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
	// From says where the leader's PID was found: the pid file, the
	// run's cgroup, the live wrapper's children or the writers of the
	// run's stdout.log.
	From string
}

// StartingLeader finds the job of a run whose record names no process
// group because its wrapper stopped acting while starting it: after the
// fork and before the `running` record (statusfile.Record.JobUnrecorded:
// the record is `starting`, or `cancelling` by a cancel that came
// meanwhile). The evidence, in order: the pid file; before it is written,
// the session leader that started first in the run's cgroup; without a
// cgroup, among the children of the wrapper if it lives (stopped, say);
// else among the processes whose fd 1 is the run's own stdout.log (the
// file, not its name: the wrapper opened it for the job). Each is a claim,
// taken only when it still makes sense: the process at that PID is a
// session leader (PID == PGID == SID) that started no earlier than the
// wrapper, alive or a zombie; or nothing is at that PID any more, and its
// group members are then to be validated against the wrapper's start time
// instead of the leader's (Leader.Start). A PID now used by anything else
// is no leader: ok is false. The caller has checked that the record is
// from this boot.
func StartingLeader(d *rundir.Dir, rec *statusfile.Record) (l Leader, ok bool) {
	if !rec.JobUnrecorded() || rec.WrapperStart == 0 {
		return l, false
	}
	pid, from := 0, "the pid file"
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
			procs, _ := cgroup.Procs(cg)
			pid, from = firstSessionLeader(procs, rec.WrapperStart), "the run's cgroup"
		} else if WrapperAlive(rec) {
			// No pid and no cgroup, but the wrapper lives (stopped, say,
			// between the fork and the pid file): the job is its child,
			// the session leader among them that started first (the
			// others are orphans of the run it adopted as subreaper).
			pid, from = firstSessionLeader(wrapperChildren(rec.WrapperPID), rec.WrapperStart), "the wrapper's children"
		} else {
			// No pid, no cgroup, no wrapper: the job was started with the
			// run's stdout.log as its fd 1, and nothing else of this boot
			// writes to that file but the job and what it started.
			pid, from = firstSessionLeader(logWriters(d, rec.WrapperPID), rec.WrapperStart), "the process writing the run's stdout.log"
		}
	}
	if pid <= 1 {
		return l, false
	}
	l = Leader{PID: pid, Start: rec.WrapperStart, From: from}
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

// firstSessionLeader returns the session leader (PID == PGID == SID) among
// procs (the run's cgroup, or its live wrapper's children) that started
// first, no earlier than the wrapper (minStart), or 0. The job's leader is
// the first process of the run; a descendant that called setsid is a
// session leader too, but started after it (in the same clock tick at
// worst, and then with a higher PID, short of a PID wrap-around within
// that tick).
func firstSessionLeader(procs []int, minStart uint64) int {
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

// StartingCgroupEmpty reports whether a run whose wrapper died before it
// recorded the job has a cgroup (the one startingCgroup finds) that holds
// no live process: its job, if it was ever started, and all it made are
// gone, since nothing but the wrapper starts a process into it.
func StartingCgroupEmpty(rec *statusfile.Record) bool {
	cg := startingCgroup(rec)
	if cg == "" {
		return false
	}
	populated, err := cgroup.Populated(cg)
	return err == nil && !populated
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

// wrapperChildren returns the PIDs of the wrapper's children: from the
// kernel's children lists where it keeps them, else from a scan of the
// process table.
func wrapperChildren(wrapper int) []int {
	if c, ok := proc.Children(wrapper); ok {
		return c
	}
	kids, _ := proc.ScanInto(nil, func(st proc.Stat) bool { return st.PPID == wrapper })
	return pidsOf(kids)
}

// logWriters returns the session leaders (the job can only be one) whose
// standard output is the run's stdout.log itself (Logs), the wrapper left
// out.
func logWriters(d *rundir.Dir, wrapper int) []int {
	logs := LogsOf(d)
	if !logs.Known() {
		return nil
	}
	w, _ := proc.ScanInto(nil, func(st proc.Stat) bool {
		return st.PID != wrapper && st.PID == st.SID && st.PID == st.PGID && logs.Holds(st.PID, 1)
	})
	return pidsOf(w)
}

// pidsOf returns the PIDs of ss.
func pidsOf(ss []proc.Stat) []int {
	pids := make([]int, 0, len(ss))
	for _, s := range ss {
		pids = append(pids, s.PID)
	}
	return pids
}
