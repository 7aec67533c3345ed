package rundir

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// holdersOf names the processes that hold a lock on the file open at fd,
// found in /proc/locks by the file's device and inode (never by a name),
// each with its start time, state and executable. A holder that exits
// while it is looked at is left out; an error leaves the list empty.
func holdersOf(fd int) []Holder {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil
	}
	pids, err := proc.LockHolders(uint64(st.Dev), st.Ino)
	if err != nil {
		return nil
	}
	out := make([]Holder, 0, len(pids))
	for _, pid := range pids {
		s, err := proc.ReadStat(pid)
		if err != nil {
			continue
		}
		h := Holder{PID: pid, Start: s.Start, State: s.State, Exe: proc.Exe(pid)}
		if pid == os.Getpid() {
			h.Self = true
		}
		out = append(out, h)
	}
	return out
}
