package rundir_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// A real process (flock(1), which keeps the lock to itself: -o) holds a run's lock and is SIGSTOPped: a
// bounded wait for the lock gives up after its wait with a *HeldError
// that names the holder by PID, start time, state and executable, read
// from /proc/locks and /proc/PID, and says it is stopped; Lock gives up
// too, after LockWait, instead of waiting for ever; once the holder is
// gone the lock is free again.
func TestLockWithinNamesAStoppedHolder(t *testing.T) {
	r, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d, err := r.Create("held")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Fatalf("flock(1) (util-linux) is needed: %v", err)
	}
	exe, err := filepath.EvalSymlinks(flock)
	if err != nil {
		t.Fatal(err)
	}
	holder := runtest.Spawn(t, nil, flock, "-o", d.Path, "sleep", "1000")
	var held *rundir.HeldError
	runtest.Eventually(t, "flock(1) to hold the run's lock", func() bool {
		unlock, err := d.LockWithin(0)
		if err == nil {
			unlock()
			return false
		}
		return errors.As(err, &held) && len(held.Holders) == 1 && held.Holders[0].PID == holder.PID
	})
	if err := unix.Kill(holder.PID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the holder to be stopped", func() bool {
		st, err := proc.ReadStat(holder.PID)
		return err == nil && st.State == 'T'
	})

	const wait = 300 * time.Millisecond
	start := time.Now()
	_, err = d.LockWithin(wait)
	took := time.Since(start)
	if !errors.As(err, &held) || !errors.Is(err, rundir.ErrLocked) {
		t.Fatalf("LockWithin on a lock held by a stopped process = %v, want a *HeldError", err)
	}
	if took < wait || held.Waited < wait {
		t.Errorf("gave up after %v (says %v), before its wait of %v", took, held.Waited, wait)
	}
	if len(held.Holders) != 1 {
		t.Fatalf("holders %+v, want flock(1) alone", held.Holders)
	}
	h := held.Holders[0]
	if h.PID != holder.PID || h.Start != holder.Start || h.State != 'T' || h.Exe != exe || h.Self || !h.Stopped() || !held.Stopped() {
		t.Errorf("holder %+v, want pid %d started at %d, state T, executable %s", h, holder.PID, holder.Start, exe)
	}
	for _, want := range []string{d.Path, "pid " + strconv.Itoa(holder.PID), exe, "tick " + strconv.FormatUint(holder.Start, 10), "stopped"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	// Lock itself is bounded: LockWait, then the same answer.
	start = time.Now()
	_, err = d.Lock()
	if !errors.As(err, &held) || time.Since(start) < rundir.LockWait || held.Holders[0].PID != holder.PID {
		t.Fatalf("Lock under a stopped holder = %v after %v, want a *HeldError naming pid %d after %v", err, time.Since(start), holder.PID, rundir.LockWait)
	}

	if err := unix.Kill(holder.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the lock to be free once its holder is killed", func() bool {
		unlock, err := d.LockWithin(0)
		if err == nil {
			unlock()
		}
		return err == nil
	})
}
