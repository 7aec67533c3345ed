package runtest

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// StopOutsideLock stops pid (SIGSTOP) at a moment it does not hold run
// r's lock (rundir's, taken without waiting), so that a test that stops a wrapper and then renews, cancels
// or ends the lease is not refused by the lock the wrapper happened to be
// holding at that instant (a stop inside the lock is a scenario of its
// own, tested by strace at an exact syscall). Stopped inside the lock, the
// process is resumed and stopped again, until the lock is free while it
// is stopped.
func (r Run) StopOutsideLock(t testing.TB, pid int) {
	t.Helper()
	root, err := rundir.OpenRoot(r.Root, false)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	d, err := root.Open(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	Eventually(t, fmt.Sprintf("pid %d stopped outside run %s's lock", pid, r.ID), func() bool {
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
		Eventually(t, fmt.Sprintf("pid %d to stop", pid), func() bool {
			st, err := proc.ReadStat(pid)
			return err == nil && (st.State == 'T' || st.State == 't')
		})
		if unlock, err := d.LockWithin(0); err == nil {
			unlock()
			return true
		}
		_ = unix.Kill(pid, unix.SIGCONT)
		return false
	})
}
