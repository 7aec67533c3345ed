package reconcile

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// GatherOutcome, list's gather, gives the outcome and supervisor Gather
// gives, in every case of the rules, with real processes: it skips the scan
// of the process table only where the outcome does not depend on it (a
// wrapper alive, a finished run), and scans where it does (a cancelled run
// with a process left, a run whose wrapper is gone). Where it does not
// scan it does not wait for the run's lock either.
func TestGatherOutcomeAgreesWithGather(t *testing.T) {
	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	job := exec.Command("sleep", "300")
	job.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Process.Kill(); job.Wait() })
	js, err := proc.ReadStat(job.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	self, err := proc.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	boot, err := proc.BootID()
	if err != nil {
		t.Fatal(err)
	}
	pid := js.PID
	// The test process stands in for a live wrapper; the same PID with
	// another start time is a wrapper that is gone.
	alive, gone := self.Start, self.Start+1
	for _, c := range []struct {
		id, state, cause string
		wrapperStart     uint64
		want, sup        string
		scans            bool
	}{
		{"live", statusfile.Running, "", alive, Running, SupervisorAlive, false},
		{"stopping", statusfile.Cancelling, "cancel", alive, Running, SupervisorAlive, false},
		{"lost", statusfile.Running, "", gone, Running, SupervisorLost, true},
		{"done", statusfile.Finished, "", gone, Completed, SupervisorNone, false},
		{"left", statusfile.Cancelled, "cancel", gone, Unknown, SupervisorNone, true},
	} {
		d, err := root.Create(c.id)
		if err != nil {
			t.Fatal(err)
		}
		rec := &statusfile.Record{RunID: c.id, State: c.state, Cause: c.cause, PID: pid, PGID: pid, SID: pid,
			LeaderStart: js.Start, WrapperPID: os.Getpid(), WrapperStart: c.wrapperStart, BootID: boot,
			Command: []string{"sleep", "300"}, CreatedAt: statusfile.Timestamp(time.Now())}
		if statusfile.Terminal(c.state) {
			code := 0
			if c.state == statusfile.Cancelled {
				code = 143
			}
			rec.ExitCode, rec.Survivors = &code, []int{}
		}
		if err := statusfile.Write(d, rec, false); err != nil {
			t.Fatal(err)
		}
		full := Gather(d)
		// Another process's stop holds the run's lock meanwhile (a
		// descriptor of its own: a flock of another open file
		// description). The outcome does not wait for it where the
		// outcome cannot depend on it; where it scans, it waits as
		// Gather does, and says it found the lock busy.
		held, err := root.Open(c.id)
		if err != nil {
			t.Fatal(err)
		}
		unlock, err := held.Lock()
		if err != nil {
			t.Fatal(err)
		}
		fast := GatherOutcome(d)
		unlock()
		held.Close()
		if fast.LockBusy != c.scans {
			t.Fatalf("%s: GatherOutcome with the run locked: lock_busy %v, want %v (it waits only where it scans)", c.id, fast.LockBusy, c.scans)
		}
		vf, vo := Decide(full), Decide(fast)
		if vf.Outcome != c.want || vf.Supervisor != c.sup {
			t.Fatalf("%s: Gather gives %s, supervisor %s; want %s, %s (%s)", c.id, vf.Outcome, vf.Supervisor, c.want, c.sup, vf.Reason)
		}
		if vo.Outcome != vf.Outcome || vo.Supervisor != vf.Supervisor || (vo.Outcome == Unknown) != (vf.Outcome == Unknown) {
			t.Fatalf("%s: GatherOutcome gives %s, supervisor %s; Gather %s, %s", c.id, vo.Outcome, vo.Supervisor, vf.Outcome, vf.Supervisor)
		}
		if scanned := len(fast.Members) > 0; scanned != c.scans {
			t.Fatalf("%s: GatherOutcome found members %v; want a scan: %v", c.id, fast.Members, c.scans)
		}
		d.Close()
	}
}
