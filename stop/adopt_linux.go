package stop

import (
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// adoptStarting fills in the job's identity (membership.StartingLeader)
// when the record names no process group because its wrapper died while
// starting the job, and journals the adoption. It reports whether rec was
// changed; the caller holds the run's lock and has checked that the record
// is from this boot.
func adoptStarting(d *rundir.Dir, rec *statusfile.Record, o Options) bool {
	l, ok := membership.StartingLeader(d, rec)
	if !ok {
		return false
	}
	rec.PID, rec.PGID, rec.SID, rec.LeaderStart = l.PID, l.PID, l.PID, l.Start
	f := journal.Fields{"pid": l.PID, "pgid": l.PID, "sid": l.PID, "leader_start": l.Start,
		"reason": "the wrapper died while starting the job; its identity is taken from the pid file"}
	if l.Cgroup != "" {
		rec.Cgroup, rec.Boundary = l.Cgroup, membership.BoundaryCgroup
		f["cgroup"] = l.Cgroup
	}
	o.journal(d, "adopted", f, true)
	return true
}
