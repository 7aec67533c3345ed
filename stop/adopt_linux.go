package stop

import (
	"strconv"
	"strings"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// adoptStarting fills in the job's identity when the record names no
// process group because its wrapper died while starting the job: after the
// fork and the pid file, before the `running` record. The pid file is a
// claim, adopted only when it still makes sense: the process at that PID is
// a session leader (PID == PGID == SID) that started no earlier than the
// wrapper, alive or a zombie; or nothing is at that PID any more, and its
// group members are then validated against the wrapper's start time
// instead of the leader's. A PID now used by anything else is left alone.
// It reports whether rec was changed; the caller holds the run's lock and
// has checked that the record is from this boot.
func adoptStarting(d *rundir.Dir, rec *statusfile.Record) bool {
	if rec.PGID > 1 || rec.State != statusfile.Starting || rec.WrapperStart == 0 {
		return false
	}
	b, err := d.ReadFile(rundir.PIDFile)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return false
	}
	start := rec.WrapperStart
	st, err := proc.ReadStat(pid)
	switch {
	case err == nil && st.PGID == pid && st.SID == pid && st.Start >= rec.WrapperStart:
		start = st.Start
	case err == nil:
		return false // the PID is someone else's now
	}
	rec.PID, rec.PGID, rec.SID, rec.LeaderStart = pid, pid, pid, start
	journal.Append(d, "adopted", journal.Fields{"pid": pid, "pgid": pid, "sid": pid, "leader_start": start,
		"reason": "the wrapper died while starting the job; its identity is taken from the pid file"}, true)
	return true
}
