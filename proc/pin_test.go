package proc

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Pin checks the identity before it holds the process; through the pin a
// signal reaches that process, and its exit is seen at once, before anyone
// reaps it.
func TestPin(t *testing.T) {
	if !havePidfd() {
		t.Fatal("this kernel has no pidfd_open; the tests run on Linux 5.3 or later")
	}
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Pin(Identity{PID: st.PID, Start: st.Start + 1}); !errors.Is(err, errMismatch) {
		t.Fatalf("Pin with the wrong start time: %v, want errMismatch", err)
	}
	p, err := Pin(Identity{PID: st.PID, Start: st.Start})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Wait(20 * time.Millisecond) {
		t.Fatal("Wait says a sleeping process exited")
	}
	if err := p.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !p.Wait(30 * time.Second) {
		t.Fatal("Wait did not see the TERMed process exit")
	}
	// Exited, not reaped: a zombie still has its PID, and the pin says so.
	if s, err := ReadStat(st.PID); err != nil || !s.Dead() {
		t.Fatalf("after Wait: %+v, %v; want a zombie", s, err)
	}
	if err := p.Signal(unix.SIGTERM); err != nil && !errors.Is(err, ErrGone) {
		t.Fatalf("Signal to the zombie: %v", err)
	}
	cmd.Wait()
	if _, err := Pin(Identity{PID: st.PID, Start: st.Start}); err == nil {
		t.Fatal("Pin of a reaped process succeeded")
	}
}
