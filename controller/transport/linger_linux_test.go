package transport

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// killLingering SIGKILLs the recorded process only if it is still that
// process (its start time) and has not exited within the time given; one
// that exits by itself is left to exit.
func TestKillLingering(t *testing.T) {
	t.Parallel()
	start := func(argv ...string) (*exec.Cmd, uint64) {
		t.Helper()
		c := exec.Command(argv[0], argv[1:]...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() }) // by pidfd, our own child
		st, err := proc.ReadStat(c.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return c, st.Start
	}
	signalOf := func(c *exec.Cmd) syscall.Signal {
		t.Helper()
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%v did not end within 30 s", c.Args)
		}
		if ws := c.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() {
			return ws.Signal()
		}
		return 0
	}

	lingers, st := start("sleep", "300")
	killLingering(lingers.Process.Pid, st, 50*time.Millisecond)
	if sig := signalOf(lingers); sig != syscall.SIGKILL {
		t.Errorf("a process that lingered ended with signal %v, want SIGKILL", sig)
	}

	leaves, st := start("sleep", "0.2")
	killLingering(leaves.Process.Pid, st, 30*time.Second)
	if sig := signalOf(leaves); sig != 0 {
		t.Errorf("a process that exited by itself within the time was signalled: %v", sig)
	}

	other, st := start("sleep", "300")
	killLingering(other.Process.Pid, st+1, 50*time.Millisecond) // another start time: not that process
	if !proc.Alive(other.Process.Pid, 0) {
		t.Fatal("a process with another start time than recorded was signalled")
	}
}
