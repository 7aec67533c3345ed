package stop

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// pin checks the identity before it holds the process, and the exit is
// seen at once, before anyone reaps it.
func TestPin(t *testing.T) {
	if !havePidfd() {
		t.Fatal("this kernel has no pidfd_open; the tests run on Linux 5.3 or later")
	}
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	st, err := proc.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pin(proc.Identity{PID: st.PID, Start: st.Start + 1}); err == nil {
		t.Fatal("pin with the wrong start time succeeded")
	}
	p, err := pin(proc.Identity{PID: st.PID, Start: st.Start})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if p.wait(20 * time.Millisecond) {
		t.Fatal("wait says a sleeping process exited")
	}
	if err := unix.Kill(st.PID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !p.wait(30 * time.Second) {
		t.Fatal("wait did not see the TERMed process exit")
	}
	// Exited, not reaped: a zombie still has its PID.
	if s, err := proc.ReadStat(st.PID); err != nil || !s.Dead() {
		t.Fatalf("after wait: %+v, %v; want a zombie", s, err)
	}
	cmd.Wait()
	if _, err := pin(proc.Identity{PID: st.PID, Start: st.Start}); err == nil {
		t.Fatal("pin of a reaped process succeeded")
	}
}
