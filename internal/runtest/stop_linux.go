package runtest

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// StopOutsideLock stops pid (SIGSTOP) at a moment it does not hold run
// r's lock, so that a test that stops a wrapper and then renews, cancels
// or ends the lease is not refused by the lock the wrapper happened to be
// holding at that instant (a stop inside the lock is a scenario of its
// own, tested by strace at an exact syscall). Stopped inside the lock, the
// process is resumed and stopped again, until the lock is free while it
// is stopped.
func (r Run) StopOutsideLock(t testing.TB, pid int) {
	t.Helper()
	fd, err := unix.Open(r.Dir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	Eventually(t, fmt.Sprintf("pid %d stopped outside run %s's lock", pid, r.ID), func() bool {
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
		Eventually(t, fmt.Sprintf("pid %d to stop", pid), func() bool {
			st, err := proc.ReadStat(pid)
			return err == nil && (st.State == 'T' || st.State == 't')
		})
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			_ = unix.Flock(fd, unix.LOCK_UN)
			return true
		}
		_ = unix.Kill(pid, unix.SIGCONT)
		return false
	})
}
