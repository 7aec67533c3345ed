package wrapper

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/exitcode"
)

// A reaper is the wrapper's one owner of waitid and wait4: every wait on the
// process's children (the job's leader, the job's orphans reparented to the
// wrapper as their child subreaper, a job whose session check failed) is
// one of its methods, and the leader's status is decoded here, once, the
// first time its exit is seen (exit). Only the supervisor's goroutine uses
// it.
//
// waitid, always with WNOWAIT, names a child that has exited and reads its
// status without reaping it; wait4 reaps a child by PID. The leader is only
// ever named, never reaped, until reapAll, which the supervisor calls once
// the group has been stopped: until then its zombie holds its PID and so the
// group's PGID, so killpg(-leader) cannot reach a recycled group, and the
// stop loop's membership checks (by PID and start time) never meet the PID
// reused by another process.
type reaper struct {
	leader int // the job's leader (PID == PGID == SID); 0 until it has started

	exited bool       // the leader has exited (it may not be reaped yet)
	exit   leaderExit // how, decoded once; the zero value until exited
}

// leaderExit is how the leader ended.
type leaderExit struct {
	// Code is the leader's exit status, or exitcode.Signal(n) if signal n
	// killed it (with or without a core dump).
	Code int
	// Signal is the signal that killed the leader; 0 if it exited.
	Signal unix.Signal
}

// _CLD_EXITED is the si_code of a child that exited (si_status is its exit
// status); the others waitid(WEXITED) gives, CLD_KILLED and CLD_DUMPED, are
// a child killed by signal si_status, without or with a core dump.
const (
	_CLD_EXITED = 1
	_CLD_KILLED = 2
)

// decodeExit is the one reading of the leader's end, from the si_code and
// si_status waitid gives for it.
func decodeExit(code int32, status int) leaderExit {
	if code == _CLD_EXITED {
		return leaderExit{Code: status}
	}
	return leaderExit{Code: exitcode.Signal(status), Signal: unix.Signal(status)}
}

// note records the leader's exit the first time it is seen, and reports
// whether this was the first time.
func (r *reaper) note(code int32, status int) bool {
	if r.exited {
		return false
	}
	r.exited, r.exit = true, decodeExit(code, status)
	return true
}

// pollLeader checks, without reaping and without blocking, whether the
// leader has exited; first is true the one time it finds that it has, and
// the exit is then decoded. Once the exit is known it asks the kernel no
// more.
func (r *reaper) pollLeader() (first bool, err error) {
	if r.exited {
		return false, nil
	}
	pid, code, status, err := waitExited(unix.P_PID, r.leader)
	if err != nil || pid != r.leader {
		return false, err
	}
	return r.note(code, status), nil
}

// reapOthers reaps exited children other than the leader (orphans of the
// job, reparented to us as their subreaper) without reading /proc: waitid
// names a zombie child; unless it is the leader, wait4 reaps it. It stops at
// the first zombie that is the leader (left for reapAll, after its group has
// been stopped) or when no child has exited.
func (r *reaper) reapOthers() { r.reapExited(false) }

// reapAll reaps the leader, if it has exited, and every other zombie child.
// The supervisor calls it once, after the group has been stopped. A leader
// whose exit is first seen here (it died after the last poll, of KILL) is
// decoded here, as everywhere, by note.
func (r *reaper) reapAll() {
	if r.exited {
		_ = reap(r.leader, true)
	}
	r.reapExited(true)
}

// reapExited reaps, one by one, the children that have exited, as waitid
// names them; with leaderToo false it stops at the leader instead of reaping
// it.
func (r *reaper) reapExited(leaderToo bool) {
	for {
		pid, code, status, err := waitExited(unix.P_ALL, 0)
		if err != nil || pid <= 0 {
			return // ECHILD: no children; 0: none has exited
		}
		if pid == r.leader {
			if !leaderToo {
				return
			}
			r.note(code, status)
		}
		if err := reap(pid, false); err != nil {
			return
		}
	}
}

// none reaps every child that has exited and reports whether no child is
// left at all: wait4 says ECHILD, for the children of every thread of the
// process at once. Called after reapAll (the leader is reaped then; if it
// has exited only now, its status is decoded here, by note).
func (r *reaper) none() bool {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ECHILD:
			return true
		case err != nil || pid == 0:
			return false // children that have not exited
		}
		if pid == r.leader {
			if ws.Signaled() {
				r.note(_CLD_KILLED, int(ws.Signal()))
			} else {
				r.note(_CLD_EXITED, ws.ExitStatus())
			}
		}
	}
}

// reapZombie reaps pid, a child that /proc shows has exited, unless it is
// the leader (whose zombie is held until reapAll).
func (r *reaper) reapZombie(pid int) {
	if pid != r.leader {
		_ = reap(pid, false)
	}
}

// discard waits for pid, a child that was never the run's job (its launch
// failed after the fork, and it has been KILLed), and reaps it. Its status
// means nothing to the run.
func (r *reaper) discard(pid int) {
	_ = reap(pid, true)
}

// waitExited is the reaper's waitid: without reaping (WNOWAIT) and without
// blocking, it names a child, selected by idtype and id, that has exited:
// its PID (0 if none has), si_code and si_status.
func waitExited(idtype, id int) (pid int, code int32, status int, err error) {
	for {
		var info unix.Siginfo
		err = unix.Waitid(idtype, id, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, 0, 0, err
		}
		pid, status = childInfo(&info)
		return pid, info.Code, status, nil
	}
}

// reap is the reaper's wait4: it reaps pid, waiting for it to exit if
// block, else only if it already has.
func reap(pid int, block bool) error {
	opts := unix.WNOHANG
	if block {
		opts = 0
	}
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, opts, nil)
		if err != unix.EINTR {
			return err
		}
	}
}

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
