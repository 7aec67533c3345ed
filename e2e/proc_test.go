package e2e

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// pstat is one process as /proc/PID/stat shows it.
type pstat struct {
	pid   int
	state byte
	ppid  int
	pgrp  int
	sid   int
	start uint64 // clock ticks since boot
}

// readStat reads /proc/PID/stat with package proc's parser.
func readStat(pid int) (pstat, bool) {
	st, err := proc.ReadStat(pid)
	if err != nil {
		return pstat{}, false
	}
	return pstat{pid: st.PID, state: st.State, ppid: st.PPID, pgrp: st.PGID, sid: st.SID, start: st.Start}, true
}

// dead reports whether the state is that of a process that runs nothing
// (proc.Stat.Dead).
func (p pstat) dead() bool { return proc.Stat{State: p.state}.Dead() }

// groupMembers lists the live processes of process group pgid.
func groupMembers(pgid int) []pstat {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []pstat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok && st.pgrp == pgid && !st.dead() {
			out = append(out, st)
		}
	}
	return out
}

// waitGroupEmpty waits until no live process is left in group pgid.
func waitGroupEmpty(t *testing.T, pgid int) {
	t.Helper()
	var left []pstat
	deadline := time.Now().Add(waitLong)
	for {
		left = groupMembers(pgid)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has live members after %v: %+v", pgid, waitLong, left)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// ancestors returns pid's parent chain, nearest first, stopping before stop
// (exclusive) or at PID 1.
func ancestors(pid, stop int) []pstat {
	var out []pstat
	for {
		st, ok := readStat(pid)
		if !ok || st.ppid <= 1 || st.ppid == stop {
			return out
		}
		p, ok := readStat(st.ppid)
		if !ok {
			return out
		}
		out = append(out, p)
		pid = st.ppid
	}
}
