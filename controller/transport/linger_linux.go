package transport

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// killLingering gives the process recorded as pid, started at start (a
// ControlMaster told to exit), up to within to exit, and SIGKILLs it if it
// has not. The process is held by a pidfd once its start time checks out,
// and the signal goes through that pidfd: a master that exits at the last
// moment cannot have its number, reused by another process, signalled.
func killLingering(pid int, start uint64, within time.Duration) {
	p, err := proc.Pin(proc.Identity{PID: pid, Start: start})
	if err != nil {
		if err == proc.ErrNoPidfd {
			killLingeringByLooking(pid, start, within)
		}
		return // gone, or not that process any more
	}
	defer p.Close()
	if p.Wait(within) {
		return
	}
	_ = unix.PidfdSendSignal(p.FD(), unix.SIGKILL, nil, 0)
}
