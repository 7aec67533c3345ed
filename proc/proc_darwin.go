package proc

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ReadStat reads what macOS keeps of a process (sysctl kern.proc.pid): no
// /proc there. Start is the start time in microseconds since the epoch, not
// clock ticks since boot: it identifies a process on this machine just as
// well, and nothing compares it across systems. A missing process is
// ErrGone.
func ReadStat(pid int) (Stat, error) {
	k, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		// The kernel answers a missing PID with no record at all, which
		// x/sys reports as a short read (EIO).
		if err == unix.EIO || err == unix.ESRCH {
			return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
		}
		return Stat{}, fmt.Errorf("pid %d: sysctl kern.proc.pid: %w", pid, err)
	}
	p := &k.Proc
	if int(p.P_pid) != pid {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	s := Stat{
		PID:   pid,
		PPID:  int(k.Eproc.Ppid),
		PGID:  int(k.Eproc.Pgid),
		State: bsdState(int(p.P_stat)),
		Start: uint64(p.P_starttime.Sec)*1e6 + uint64(p.P_starttime.Usec),
	}
	if sid, err := unix.Getsid(pid); err == nil {
		s.SID = sid
	}
	for _, c := range p.P_comm {
		if c == 0 {
			break
		}
		s.Comm += string(rune(c))
	}
	return s, nil
}
