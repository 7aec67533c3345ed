package authority

import (
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// InRun is the Member every caller uses: the run's own answer to "is this
// process one of mine?".
func InRun(rec *statusfile.Record, pid int, start uint64) bool {
	if pid <= 0 || start == 0 || stop.Check(rec) != nil {
		return false
	}
	ts, _, err := stop.Live(rec)
	if err != nil {
		return false
	}
	for _, t := range ts {
		if t.PID == pid && t.Start == start {
			return true
		}
	}
	return false
}
