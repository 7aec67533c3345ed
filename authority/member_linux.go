package authority

import (
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// InRun is the Member for a gateway outside the run's wrapper: the run's
// record, judged by membership (cgroup, session, recorded escapes, start
// times).
func InRun(rec *statusfile.Record, pid int, start uint64) bool {
	_, err := membership.Run{Record: rec}.Contains(pid, start)
	return err == nil
}
