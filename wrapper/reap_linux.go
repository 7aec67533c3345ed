package wrapper

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
)

// pollLeader checks, without reaping, whether the leader has exited.
func (s *supervisor) pollLeader() bool {
	if s.leaderExited {
		return true
	}
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, s.leader, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			s.warn("waitid(%d): %v", s.leader, err)
			return false
		}
		break
	}
	pid, status := childInfo(&info)
	if pid != s.leader {
		return false
	}
	s.leaderExited = true
	f := journal.Fields{"pid": s.leader}
	switch info.Code {
	case _CLD_EXITED:
		s.leaderCode = status
		f["exit_code"] = status
	default: // killed or dumped
		s.leaderSig = unix.Signal(status)
		s.leaderCode = 128 + status
		f["signal"] = proc.SignalName(s.leaderSig)
	}
	s.journal("leader_exited", f, false)
	return true
}

const (
	_CLD_EXITED = 1
)

// childInfo reads si_pid and si_status from a SIGCHLD siginfo, which
// x/sys/unix keeps opaque: after si_signo, si_errno and si_code (three
// int32s), the union is pointer-aligned; its sigchld member starts with
// pid_t si_pid, uid_t si_uid, int si_status.
func childInfo(si *unix.Siginfo) (pid, status int) {
	off := uintptr(12)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	base := unsafe.Pointer(si)
	pid = int(*(*int32)(unsafe.Add(base, off)))
	status = int(*(*int32)(unsafe.Add(base, off+8)))
	return pid, status
}

// reapOthers reaps exited children other than the leader (orphans of the
// job, reparented to us as their subreaper) without reading /proc:
// waitid(WNOWAIT) names a zombie child; unless it is the leader, wait4 reaps
// it. The leader is left for reapAll, after its group has been stopped.
func (s *supervisor) reapOthers() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return // ECHILD: no children
		}
		pid, _ := childInfo(&info)
		if pid <= 0 || pid == s.leader {
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil && err != unix.EINTR {
			return
		}
	}
}

// reapAll reaps the leader, now that its group has been stopped, and every
// other zombie child.
func (s *supervisor) reapAll() {
	if s.leaderExited {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(s.leader, &ws, 0, nil)
			if err != unix.EINTR {
				break
			}
		}
	} else {
		s.pollLeader()
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if pid == s.leader && !s.leaderExited {
			// Reaped here after KILL: take its status.
			s.leaderExited = true
			if ws.Signaled() {
				s.leaderSig = ws.Signal()
				s.leaderCode = 128 + int(ws.Signal())
			} else {
				s.leaderCode = ws.ExitStatus()
			}
		}
	}
}
