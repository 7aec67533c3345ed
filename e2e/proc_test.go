package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
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

// readStat parses /proc/PID/stat, counting fields from the last ')' because
// the command name may hold spaces and parentheses.
func readStat(pid int) (pstat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return pstat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return pstat{}, false
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3, state
	if len(f) < 20 || len(f[0]) != 1 {
		return pstat{}, false
	}
	st := pstat{pid: pid, state: f[0][0]}
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	st.sid, _ = strconv.Atoi(f[3])
	st.start, _ = strconv.ParseUint(f[19], 10, 64)
	return st, true
}

// dead reports whether the state is that of a process that runs nothing.
func (p pstat) dead() bool { return p.state == 'Z' || p.state == 'X' }

// alive reports whether pid is the live (not zombie) process that started at
// start (any start when start is 0).
func alive(pid int, start uint64) bool {
	st, ok := readStat(pid)
	return ok && !st.dead() && (start == 0 || st.start == start)
}

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
