package stop

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// This file holds everything in agent-wrap that sends a signal: Signal, to
// one recorded process, and KillCgroup, to a run's cgroup. Nothing that only
// judges (membership, reconcile) imports it.

var (
	pidfdOnce sync.Once
	pidfdOK   bool
)

// havePidfd reports whether pidfd_open and pidfd_send_signal work here
// (Linux 5.3 and later). Probed once, on ourselves.
func havePidfd() bool {
	pidfdOnce.Do(func() {
		fd, err := unix.PidfdOpen(os.Getpid(), 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		pidfdOK = unix.PidfdSendSignal(fd, 0, nil, 0) == nil
	})
	return pidfdOK
}

// Signal sends sig to the process recorded as id, after checking that the
// process now at id.PID is that process. With pidfds, the process is pinned
// before the check, so a recycled PID can never receive the signal. A
// process that is gone is proc.ErrGone; one that no longer matches is an
// error from Identity.Check, and nothing is sent.
func Signal(id proc.Identity, sig unix.Signal) error {
	if id.PID <= 1 {
		return fmt.Errorf("pid %d: refusing to signal it", id.PID)
	}
	if havePidfd() {
		fd, err := unix.PidfdOpen(id.PID, 0)
		if err != nil {
			if err == unix.ESRCH {
				return fmt.Errorf("pid %d: %w", id.PID, proc.ErrGone)
			}
			return os.NewSyscallError("pidfd_open", err)
		}
		defer unix.Close(fd)
		s, err := proc.ReadStat(id.PID)
		if err != nil {
			return err
		}
		if err := id.Check(s); err != nil {
			return err
		}
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
			if err == unix.ESRCH {
				return fmt.Errorf("pid %d: %w", id.PID, proc.ErrGone)
			}
			return os.NewSyscallError("pidfd_send_signal", err)
		}
		return nil
	}
	s, err := proc.ReadStat(id.PID)
	if err != nil {
		return err
	}
	if err := id.Check(s); err != nil {
		return err
	}
	if err := unix.Kill(id.PID, sig); err != nil {
		if err == unix.ESRCH {
			return fmt.Errorf("pid %d: %w", id.PID, proc.ErrGone)
		}
		return os.NewSyscallError("kill", err)
	}
	return nil
}

// KillCgroup kills every process in the run cgroup at path with cgroup.kill
// (Linux 5.14), which the kernel applies to the whole cgroup at once, forks
// in flight included. Where cgroup.kill is missing it returns an error
// wrapping os.ErrNotExist and the caller signals the PIDs itself. The path
// must be one the caller trusts (its own, or cgroup.Valid).
func KillCgroup(path string) error {
	f, err := os.OpenFile(filepath.Join(path, "cgroup.kill"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString("1")
	return err
}
