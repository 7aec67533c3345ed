package proc_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/agent-wrap/agent-wrap/proc"
)

// TestReadStatPortable checks what every build of ReadStat gives (the
// controller's needs on Linux, macOS and FreeBSD): this process's PID,
// parent, group and a start time; a child started later starts no
// earlier; a reaped child is ErrGone.
func TestReadStatPortable(t *testing.T) {
	self, err := proc.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self.PID != os.Getpid() || self.PPID != os.Getppid() || self.PGID == 0 || self.Start == 0 || self.Dead() {
		t.Fatalf("ReadStat(self) = %+v; want pid %d, ppid %d, a group, a start time, alive", self, os.Getpid(), os.Getppid())
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	child, err := proc.ReadStat(pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	if child.PPID != os.Getpid() || child.Start < self.Start || child.Dead() {
		t.Errorf("ReadStat(child) = %+v; want parent %d, start >= %d, alive", child, os.Getpid(), self.Start)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if st, err := proc.ReadStat(pid); err == nil && st.Start == child.Start {
		t.Errorf("ReadStat(reaped child %d) = %+v, %v; want ErrGone", pid, st, err)
	}
}
