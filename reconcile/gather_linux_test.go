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

// Gather on a real process: a record written by hand for a `sleep` the test
// starts in its own session, with a wrapper PID that is not running. While
// sleep runs the verdict is running, supervisor lost, naming it; once it is
// dead (a zombie counts), unknown; and Gather never wrote a thing.
func TestGatherRealProcess(t *testing.T) {
	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	d, err := root.Create("g1")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	cmd := exec.Command("sleep", "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	st, err := proc.ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := proc.BootID()
	if err != nil {
		t.Fatal(err)
	}
	// A wrapper that is not running: our own PID with a start time that is
	// not ours.
	self, _ := proc.ReadStat(os.Getpid())
	rec := &statusfile.Record{RunID: "g1", State: statusfile.Running, PID: pid, PGID: pid, SID: pid,
		LeaderStart: st.Start, WrapperPID: os.Getpid(), WrapperStart: self.Start + 1, BootID: boot,
		Command: []string{"sleep", "300"}, CreatedAt: statusfile.Timestamp(time.Now())}
	if err := statusfile.Write(d, rec, false); err != nil {
		t.Fatal(err)
	}
	before := modTimes(t, d.Path)

	in := Gather(d)
	v := Decide(in)
	if v.Outcome != Running || v.Supervisor != SupervisorLost || len(v.Evidence.Members) != 1 || v.Evidence.Members[0].PID != pid {
		t.Fatalf("live sleep: %+v", v)
	}
	if in.WrapperAlive || in.BootChanged || in.MembersErr != nil || in.LockBusy {
		t.Fatalf("evidence: %+v", in)
	}

	// Kill it but do not reap it yet: a zombie is dead.
	cmd.Process.Kill()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if !proc.Alive(pid, 0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep %d did not die of SIGKILL", pid)
		}
	}
	v = Decide(Gather(d))
	if v.Outcome != Unknown || len(v.Evidence.Members) != 0 {
		t.Fatalf("zombie sleep: %+v", v)
	}
	cmd.Wait()
	exited = true

	if after := modTimes(t, d.Path); len(after) != len(before) {
		t.Fatalf("Gather changed the run directory: %v, then %v", before, after)
	} else {
		for name, mt := range before {
			if !after[name].Equal(mt) {
				t.Fatalf("Gather touched %s", name)
			}
		}
	}
}

func modTimes(t *testing.T, dir string) map[string]time.Time {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fi.ModTime()
	}
	return out
}
