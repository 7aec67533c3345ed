package rundir_test

import (
	"errors"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// A root lock (the watchdog's, held for its life) holds no descriptor open
// for writing: the file system under the root can be remounted read-only
// while it is held, and the lock still excludes a second holder then, and
// can be taken anew on the read-only root.
func TestTryLockLetsTheRootGoReadOnly(t *testing.T) {
	mnt := runtest.Tmpfs(t, 1<<20)
	root, err := rundir.OpenRoot(mnt, false)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	unlock, err := root.TryLock(".watchdog.lock")
	if err != nil {
		t.Fatal(err)
	}
	runtest.Remount(t, mnt, true) // fails the test on EBUSY
	defer runtest.Remount(t, mnt, false)
	if _, err := root.TryLock(".watchdog.lock"); !errors.Is(err, rundir.ErrLocked) {
		t.Fatalf("a second TryLock on the read-only root: %v, want ErrLocked", err)
	}
	unlock()
	again, err := root.TryLock(".watchdog.lock")
	if err != nil {
		t.Fatalf("TryLock on the read-only root once free: %v", err)
	}
	again()
}
