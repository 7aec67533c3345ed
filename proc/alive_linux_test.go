package proc_test

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// TestAliveRecycledPID recycles a PID for real: a child is started,
// recorded as (PID, start), killed and reaped; then the kernel is asked
// (ns_last_pid, root only) to give the next process that same PID, until a
// new child gets it at a later clock tick. Alive must say the recorded
// process is gone and the new one runs, though both have the one PID.
func TestAliveRecycledPID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test sets /proc/sys/kernel/ns_last_pid: run it as root")
	}
	first := exec.Command("sleep", "300")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	pid := first.Process.Pid
	st, err := proc.ReadStat(pid)
	if err != nil {
		first.Process.Kill()
		first.Wait()
		t.Fatal(err)
	}
	first.Process.Kill()
	first.Wait()

	// Other processes of the host fork too, and one started in the same
	// clock tick has the same start time (the identity cannot tell those
	// apart): try again until the PID is ours at a later tick.
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; ; attempt++ {
		if time.Now().After(deadline) {
			t.Fatalf("PID %d not given to a new child at a later tick within 60s (%d attempts)", pid, attempt-1)
		}
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatal(err)
		}
		again := exec.Command("sleep", "300")
		if err := again.Start(); err != nil {
			t.Fatal(err)
		}
		now, err := proc.ReadStat(again.Process.Pid)
		if again.Process.Pid != pid || err != nil || now.Start == st.Start {
			again.Process.Kill()
			again.Wait()
			time.Sleep(time.Millisecond)
			continue
		}
		alive := proc.Alive(pid, now.Start)
		recorded := proc.Alive(pid, st.Start)
		again.Process.Kill()
		again.Wait()
		if !alive {
			t.Errorf("Alive(%d, %d) = false for the running child at the recycled PID", pid, now.Start)
		}
		if recorded {
			t.Errorf("Alive(%d, %d) = true: the recorded child is gone, another (started at tick %d) has its PID", pid, st.Start, now.Start)
		}
		t.Logf("PID %d recycled after %d attempts: recorded start %d, new start %d", pid, attempt, st.Start, now.Start)
		return
	}
}
