package e2e

import (
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// waitGroupEmpty waits until no live process is left in group pgid.
func waitGroupEmpty(t *testing.T, pgid int) {
	t.Helper()
	var left []proc.Stat
	deadline := time.Now().Add(waitLong)
	for {
		left = runtest.Members(pgid)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has live members after %v: %+v", pgid, waitLong, left)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// childrenOf lists the live children of pid.
func childrenOf(pid int) []proc.Stat {
	out, _ := proc.ScanInto(nil, func(st proc.Stat) bool { return st.PPID == pid && !st.Dead() })
	return out
}

// ancestors returns pid's parent chain, nearest first, stopping before stop
// (exclusive) or at PID 1.
func ancestors(pid, stop int) []proc.Stat {
	var out []proc.Stat
	for {
		st, err := proc.ReadStat(pid)
		if err != nil || st.PPID <= 1 || st.PPID == stop {
			return out
		}
		p, err := proc.ReadStat(st.PPID)
		if err != nil {
			return out
		}
		out = append(out, p)
		pid = st.PPID
	}
}
