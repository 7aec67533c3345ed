package stop

import (
	"fmt"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// adoptStarting fills in the job's identity (membership.StartingLeader)
// when the record names no process group because its wrapper stopped
// acting while starting the job, and journals the adoption. It reports
// whether rec was changed; the caller holds the run's lock and has checked
// that the record is from this boot.
func adoptStarting(d *rundir.Dir, rec *statusfile.Record, o Options) bool {
	l, ok := membership.StartingLeader(d, rec)
	if !ok {
		return false
	}
	rec.PID, rec.PGID, rec.SID, rec.LeaderStart = l.PID, l.PID, l.PID, l.Start
	f := journal.Fields{"pid": l.PID, "pgid": l.PID, "sid": l.PID, "leader_start": l.Start,
		"reason": "the wrapper did not record the job it started; its identity is taken from " + l.From}
	if l.Cgroup != "" {
		rec.Cgroup, rec.Boundary = l.Cgroup, membership.BoundaryCgroup
		f["cgroup"] = l.Cgroup
	}
	o.journal(d, "adopted", f, true)
	if rec.State == statusfile.Cancelling {
		// The cancel is on record already, so the intent's write that
		// would carry the identity is skipped: the record carries it now,
		// for the final record and for whoever looks meanwhile.
		if err := writeRecord(d)(rec); err != nil {
			fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot record the adopted job: %v (stopping it anyway)\n", d.ID, err)
		}
	}
	return true
}
