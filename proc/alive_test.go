package proc_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// TestAlive checks proc.Alive against real processes: this one, a live
// child with its start time (and with a start time it does not have, as a
// recycled PID would show), the same child as a zombie (dead, though its
// PID is still in the table), and once it is reaped.
func TestAlive(t *testing.T) {
	if !proc.Alive(os.Getpid(), 0) {
		t.Fatal("Alive(self, any start) = false")
	}
	for _, pid := range []int{0, -1} {
		if proc.Alive(pid, 0) {
			t.Errorf("Alive(%d, 0) = true", pid)
		}
	}
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	st, err := proc.ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("live", func(t *testing.T) {
		if !proc.Alive(pid, st.Start) || !proc.Alive(pid, 0) {
			t.Fatalf("Alive(%d, %d) or Alive(%d, 0) = false for a running child", pid, st.Start, pid)
		}
	})
	t.Run("recycled", func(t *testing.T) {
		// Another start time at the same PID is another process: the
		// recorded one is gone, whatever runs at its PID now.
		for _, other := range []uint64{st.Start + 1, st.Start - 1} {
			if proc.Alive(pid, other) {
				t.Errorf("Alive(%d, %d) = true; the child started at %d", pid, other, st.Start)
			}
		}
	})
	t.Run("zombie", func(t *testing.T) {
		// Killed and not yet waited for: a zombie keeps its PID and its
		// start time, and runs nothing.
		if err := cmd.Process.Signal(os.Kill); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			z, err := proc.ReadStat(pid)
			if err != nil {
				t.Fatalf("the unreaped child %d: %v", pid, err)
			}
			if z.State == 'Z' {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("child %d not a zombie within 30s: state %c", pid, z.State)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if proc.Alive(pid, st.Start) || proc.Alive(pid, 0) {
			t.Fatalf("Alive says the zombie %d runs", pid)
		}
	})
	t.Run("reaped", func(t *testing.T) {
		cmd.Wait()
		reaped = true
		if proc.Alive(pid, st.Start) {
			t.Fatalf("Alive(%d, %d) = true after the child was reaped", pid, st.Start)
		}
	})
}
