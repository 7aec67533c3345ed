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
	root, _, js, self, boot := outcomeFixture(t)
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

// GatherOutcomeFirst leaves the process table to its caller where the
// outcome depends on the members, and GatherOutcomeWith judges them in the
// table read after that first look, as Gather would: a cancelled run with
// its job still alive is unknown, naming the job. A table read before the
// record moved on is not used: once the job is dead and the record says
// so, the stale table (which shows the job alive) would make the run
// unknown; GatherOutcomeWith reads its own and confirms the cancel.
func TestGatherOutcomeWithTable(t *testing.T) {
	root, job, js, self, boot := outcomeFixture(t)
	pid := js.PID
	d, err := root.Create("left")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	code := 143
	rec := &statusfile.Record{RunID: "left", State: statusfile.Running, PID: pid, PGID: pid, SID: pid,
		LeaderStart: js.Start, WrapperPID: os.Getpid(), WrapperStart: self.Start + 1, BootID: boot,
		Command: []string{"sleep", "300"}, CreatedAt: statusfile.Timestamp(time.Now())}
	if err := statusfile.Write(d, rec, false); err != nil {
		t.Fatal(err)
	}

	// The wrapper is gone and the job alive: running, supervisor lost.
	first, needs := GatherOutcomeFirst(d)
	if !needs || len(first.Members) != 0 {
		t.Fatalf("GatherOutcomeFirst of a run whose wrapper is gone: needsTable %v, members %v; want true and none", needs, first.Members)
	}
	table, err := proc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	in := GatherOutcomeWith(d, first, table)
	v, want := Decide(in), Decide(Gather(d))
	if v.Outcome != Running || v.Supervisor != SupervisorLost || len(in.Members) != 1 || in.Members[0].PID != pid {
		t.Fatalf("GatherOutcomeWith: %s, supervisor %s, members %v; want running, lost, the job %d (%s)", v.Outcome, v.Supervisor, in.Members, pid, v.Reason)
	}
	if v.Outcome != want.Outcome || v.Supervisor != want.Supervisor {
		t.Fatalf("GatherOutcomeWith gives %s/%s, Gather %s/%s", v.Outcome, v.Supervisor, want.Outcome, want.Supervisor)
	}

	// Cancelled meanwhile: the job is killed and reaped, then the record
	// says cancelled. The table read before shows the job alive.
	first, needs = GatherOutcomeFirst(d)
	if !needs {
		t.Fatal("GatherOutcomeFirst of a lost run: no table needed")
	}
	stale, err := proc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	job.Process.Kill()
	job.Wait()
	rec.State, rec.Cause, rec.ExitCode, rec.Survivors = statusfile.Cancelled, statusfile.CauseCancel, &code, []int{}
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
	in = GatherOutcomeWith(d, first, stale)
	if v := Decide(in); v.Outcome != Cancelled || len(in.Members) != 0 {
		t.Fatalf("GatherOutcomeWith after the record moved on: %s, members %v; want cancelled, none (a stale table was used: %s)", v.Outcome, in.Members, v.Reason)
	}
}

// outcomeFixture is the two tests' setting: a run root, a job (sleep 300 in
// a session of its own, killed and reaped at cleanup unless the test did
// so), its stat and the test process's (which stands in for a wrapper),
// and the boot ID.
func outcomeFixture(t *testing.T) (root *rundir.Root, job *exec.Cmd, js, self proc.Stat, boot string) {
	t.Helper()
	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	job = exec.Command("sleep", "300")
	job.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if job.ProcessState == nil { // not reaped by the test
			job.Process.Kill()
			job.Wait()
		}
	})
	if js, err = proc.ReadStat(job.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if self, err = proc.ReadStat(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if boot, err = proc.BootID(); err != nil {
		t.Fatal(err)
	}
	return root, job, js, self, boot
}
