package sshtest

import (
	"os"
	"strconv"
	"strings"
)

// procStat is what this package reads from /proc/PID/stat.
type procStat struct {
	state byte
	ppid  int
	start uint64 // field 22: start time, clock ticks since boot
}

// readStat parses /proc/PID/stat. The command name (field 2) may hold spaces
// and parentheses, so the fields are counted from the last ')'.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return procStat{}, false
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || len(f[0]) != 1 {
		return procStat{}, false
	}
	return procStat{state: f[0][0], ppid: ppid, start: start}, true
}

// startTime returns the start time of pid, or false when it does not exist.
func startTime(pid int) (uint64, bool) {
	st, ok := readStat(pid)
	return st.start, ok
}

// alive reports whether pid exists, is not a zombie, and (when start is not
// zero) is still the process that started at start. A zombie is dead: it
// keeps its PID but runs nothing, and PID 1 may reap it late.
func alive(pid int, start uint64) bool {
	st, ok := readStat(pid)
	if !ok || st.state == 'Z' || st.state == 'X' {
		return false
	}
	return start == 0 || st.start == start
}

// proc names one process by PID and start time, which together survive PID
// reuse.
type proc struct {
	pid   int
	start uint64
}

// childrenOf lists the live processes whose parent is ppid.
func childrenOf(ppid int) []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok && st.ppid == ppid && st.state != 'Z' {
			out = append(out, proc{pid, st.start})
		}
	}
	return out
}
