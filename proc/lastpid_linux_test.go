package proc_test

import (
	"os/exec"
	"testing"

	"github.com/agent-wrap/agent-wrap/proc"
)

// A kept-open ns_last_pid answers each read anew: after a child is forked,
// it says at least the child's PID (or a smaller one if the counter wrapped
// round pid_max meanwhile), as LastPID does. Closed, it reads through
// LastPID.
func TestLastPIDFileReadsAnew(t *testing.T) {
	f, err := proc.OpenLastPID()
	if err != nil {
		t.Fatal(err)
	}
	before, err := f.Read()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	child := c.Process.Pid
	after, err := f.Read()
	if err != nil {
		t.Fatal(err)
	}
	if after == before || (child > before && after < child) {
		t.Fatalf("ns_last_pid read %d before and %d after forking %d: the kept file did not answer anew", before, after, child)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if v, err := f.Read(); err != nil || v < 1 {
		t.Fatalf("a closed LastPIDFile reads %d, %v; want LastPID's answer", v, err)
	}
}
