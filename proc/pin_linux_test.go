package proc

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Pin checks the identity before it holds the process, and the exit is
// seen at once, before anyone reaps it.
func TestPin(t *testing.T) {
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Pin(Identity{PID: st.PID, Start: st.Start + 1}); err == nil || errors.Is(err, ErrNoPidfd) {
		t.Fatal("pin with the wrong start time succeeded")
	}
	p, err := Pin(Identity{PID: st.PID, Start: st.Start})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Wait(20*time.Millisecond) || p.Exited() {
		t.Fatal("wait says a sleeping process exited")
	}
	if err := unix.Kill(st.PID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !p.Wait(30 * time.Second) {
		t.Fatal("wait did not see the TERMed process exit")
	}
	if !p.Exited() {
		t.Fatal("Exited is false after Wait saw the exit")
	}
	// Exited, not reaped: a zombie still has its PID.
	if s, err := ReadStat(st.PID); err != nil || !s.Dead() {
		t.Fatalf("after wait: %+v, %v; want a zombie", s, err)
	}
	cmd.Wait()
	if _, err := Pin(Identity{PID: st.PID, Start: st.Start}); err == nil {
		t.Fatal("pin of a reaped process succeeded")
	}
}
