package sshtest

import "github.com/agent-wrap/agent-wrap/proc"

// startTime returns the start time of pid, or false when it does not exist.
func startTime(pid int) (uint64, bool) {
	st, err := proc.ReadStat(pid)
	return st.Start, err == nil
}

// process names one process by PID and start time, which together survive
// PID reuse.
type process struct {
	pid   int
	start uint64
}

// childrenOf lists the live processes whose parent is ppid.
func childrenOf(ppid int) []process {
	kids, err := proc.ScanInto(nil, func(st proc.Stat) bool { return st.PPID == ppid && !st.Dead() })
	if err != nil {
		return nil
	}
	var out []process
	for _, st := range kids {
		out = append(out, process{st.PID, st.Start})
	}
	return out
}
