package authority

import (
	"github.com/agent-wrap/agent-wrap/rundir"
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

// FindRun returns the open run directory of the live run under root that
// holds the process pid with start time start, or nil when none does.
func FindRun(root *rundir.Root, pid int, start uint64) *rundir.Dir {
	ids, err := root.List()
	if err != nil {
		return nil
	}
	for _, id := range ids {
		d, err := root.Open(id)
		if err != nil {
			continue
		}
		rec, err := statusfile.Read(d)
		if err == nil && !statusfile.Terminal(rec.State) && InRun(rec, pid, start) {
			return d
		}
		d.Close()
	}
	return nil
}
