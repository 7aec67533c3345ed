package stop_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

// Signal checks identity first: a wrong start time (a recycled PID) gets no
// signal; the right one does; a gone process is proc.ErrGone.
func TestSignalValidates(t *testing.T) {
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	st, err := proc.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	err = stop.Signal(proc.Identity{PID: st.PID, Start: st.Start + 1}, unix.SIGKILL)
	if err == nil || errors.Is(err, proc.ErrGone) || !strings.Contains(err.Error(), "PID reused") {
		t.Fatalf("wrong start time: %v, want a mismatch", err)
	}
	err = stop.Signal(proc.Identity{PID: st.PID, Start: st.Start, PGID: st.PGID + 1}, unix.SIGKILL)
	if err == nil || errors.Is(err, proc.ErrGone) || !strings.Contains(err.Error(), "process group") {
		t.Fatalf("wrong group: %v, want a mismatch", err)
	}
	if s, _ := proc.ReadStat(st.PID); s.Dead() {
		t.Fatal("signalled despite the mismatch")
	}
	if err := stop.Signal(proc.Identity{PID: st.PID, Start: st.Start}, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := stop.Signal(proc.Identity{PID: st.PID, Start: st.Start}, 0)
		if errors.Is(err, proc.ErrGone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reaped process still signallable: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop.Signal(proc.Identity{PID: 1}, unix.SIGTERM); err == nil || errors.Is(err, proc.ErrGone) {
		t.Fatalf("pid 1 must never be signalled: %v", err)
	}
}
