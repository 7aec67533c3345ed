package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The five failure paths of a remote job, each driven through the
// controller (`agent-wrap ssh`), each judged from the host's /proc. The
// fifth, two runs and one cancelled, is TestSSHTwoControllersOneCancelled.

// Failure path 1: TERM to the wrapper on the host. The run is cancelled
// (signal:TERM, 143); the controller exits 143 and the ledger says so.
func TestSSHFailTermWrapper(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.start("fail-wrapper", longLease, sleepTree...)
	runtest.Eventually(t, "started", func() bool { return strings.Contains(k.stdout(), "started\n") })
	r := c.waitRunning("fail-wrapper")
	waitMembers(t, r.PGID, 3)
	if !proc.Alive(r.WrapperPID, r.WrapperStart) {
		t.Fatalf("wrapper %d not alive", r.WrapperPID)
	}
	syscall.Kill(r.WrapperPID, syscall.SIGTERM)
	if code := k.wait(t); code != 143 {
		t.Errorf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	wantFinal(t, c.waitTerminal("fail-wrapper"), "cancelled", "signal:TERM", 143)
	c.treeGone("fail-wrapper")
	c.wantSettled("fail-wrapper", "cancelled", "signal:TERM", 143)
}

// Failure path 2: TERM to the job's leader. The leader dies by TERM (128+15),
// the wrapper stops the rest of its group, the run is finished; the
// controller exits 143 and the ledger says completed, not cancelled.
func TestSSHFailTermLeader(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.start("fail-leader", longLease, sleepTree...)
	runtest.Eventually(t, "started", func() bool { return strings.Contains(k.stdout(), "started\n") })
	r := c.waitRunning("fail-leader")
	waitMembers(t, r.PGID, 3)
	syscall.Kill(r.PID, syscall.SIGTERM)
	if code := k.wait(t); code != 143 {
		t.Errorf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	final := c.waitTerminal("fail-leader")
	if final.State != "finished" || final.Signal != "TERM" {
		t.Errorf("final record %v, want finished by TERM", final)
	}
	c.treeGone("fail-leader")
	c.wantSettled("fail-leader", "completed", "", 143)
}

// Failure path 3: the client killed without a signal reaching the job: the
// controller's ssh client SIGKILLed and every connection cut. The job runs
// on untouched (every member alive); the controller reattaches and, when
// the job ends, exits with its code.
func TestSSHFailClientKilled(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	gate := filepath.Join(t.TempDir(), "go")
	job := []string{"sh", "-c", `sleep 300 & echo before; while [ ! -e "$1" ]; do sleep 0.1; done; kill $!; echo after; exit 9`, "sh", gate}
	k := c.start("fail-client", longLease, job...)
	runtest.Eventually(t, "before", func() bool { return strings.Contains(k.stdout(), "before\n") })
	r := c.waitRunning("fail-client")
	members := waitMembers(t, r.PGID, 2)
	var pid int
	runtest.Eventually(t, "the attach client", func() bool { pid = k.attachClient(); return pid > 0 })
	syscall.Kill(pid, syscall.SIGKILL)
	c.rl.Cut()
	c.waitEvent("fail-client", "detached", 0)
	c.waitEvent("fail-client", "attached", 0)
	for _, m := range members {
		if !proc.Alive(m.PID, m.Start) {
			t.Errorf("member %d died with the client", m.PID)
		}
	}
	if cur, _ := c.status("fail-client"); cur.State != "running" {
		t.Errorf("run after the client was killed: %v, want running", cur)
	}
	os.WriteFile(gate, nil, 0o600)
	if code := k.wait(t); code != 9 {
		t.Errorf("controller exit %d, want 9\nstderr: %s", code, k.stderr())
	}
	if got := k.stdout(); got != "before\nafter\n" {
		t.Errorf("stdout %q", got)
	}
	c.treeGone("fail-client")
	c.wantSettled("fail-client", "completed", "", 9)
}

// Failure path 4: a disconnect between `cancelling` and the final record.
// The job ignores TERM, so the run stays cancelling for its grace; every
// connection (the attach and the cancel's) is cut then. The controller
// reconnects, confirms the cancel, and exits with the final record's code.
func TestSSHFailDisconnectWhileCancelling(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	job := []string{"sh", "-c", `trap "" TERM; sleep 300 & echo started; wait; wait`}
	k := c.start("fail-cancelling", []string{"--lease", "120s", "--grace", "4s"}, job...)
	runtest.Eventually(t, "started", func() bool { return strings.Contains(k.stdout(), "started\n") })
	r := c.waitRunning("fail-cancelling")
	waitMembers(t, r.PGID, 2)
	k.signal(t, syscall.SIGINT)
	c.waitState("fail-cancelling", "cancelling", func(r record) bool { return r.State == "cancelling" })
	c.rl.Cut()
	if code := k.wait(t); code != 143 {
		t.Errorf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	wantFinal(t, c.waitTerminal("fail-cancelling"), "cancelled", "cancel", 143)
	c.treeGone("fail-cancelling")
	c.wantSettled("fail-cancelling", "cancelled", "cancel", 143)
	if ev := c.ctlEvents("fail-cancelling"); !contains(ev, "cancel_confirmed") || !contains(ev, "detached") {
		t.Errorf("events lack detached or cancel_confirmed: %v", ev)
	}
}
