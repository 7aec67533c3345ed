package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The lease holds when the supervisor does not: the wrapper of a detached run
// is SIGKILLed, reconcile over ssh says running with the supervisor lost, and
// once the deadline has passed `watchdog --once` over ssh stops the group;
// reconcile then says cancelled. The run starts with a long lease, ended on
// demand (renew --lease 1s) once the wrapper is dead and checked.
func TestWatchdogStopsRunOfDeadWrapper(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "orphaned"
	if res := h.ssh("run", "--detach", "--lease", "5m", "--grace", "1s", id, "--", "sh", "-c", treeJob); res.code != 0 {
		t.Fatalf("run --detach: exit %d\nstderr: %s", res.code, res.stderr)
	}
	r := h.waitRunning(id)
	members := waitMembers(t, r.PGID, 3)

	// Kill the wrapper, by its recorded PID checked against its start time.
	if st, err := proc.ReadStat(r.WrapperPID); err != nil || st.Start != r.WrapperStart {
		t.Fatalf("wrapper %d is not the recorded process (start %d, recorded %d)", r.WrapperPID, st.Start, r.WrapperStart)
	}
	if err := syscall.Kill(r.WrapperPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the wrapper to die", func() bool { return !proc.Alive(r.WrapperPID, r.WrapperStart) })

	code, v := h.reconcileJSON(id)
	if code != 3 || v["outcome"] != "running" || v["supervisor"] != "lost" {
		t.Errorf("reconcile with the wrapper dead: exit %d, %v; want exit 3, outcome running, supervisor lost", code, v)
	}

	// End the lease on demand, now that the checks above are made.
	deadline := h.endLease(id)
	runtest.Eventually(t, "the lease deadline to pass", func() bool { return time.Now().After(deadline.Add(time.Second)) })
	for _, m := range members {
		if !proc.Alive(m.PID, m.Start) {
			t.Fatalf("member %d died before the watchdog ran: nothing left to prove", m.PID)
		}
	}
	w := h.ssh("watchdog", "--once")
	if w.code != 0 || !strings.Contains(w.stdout, id) {
		t.Errorf("watchdog --once: exit %d, stdout %q; want 0 and a line about %s\nstderr: %s", w.code, w.stdout, id, w.stderr)
	}
	waitGroupEmpty(t, r.PGID)
	for _, m := range members {
		if proc.Alive(m.PID, m.Start) {
			t.Errorf("member %d alive after the watchdog", m.PID)
		}
	}
	final := h.waitTerminal(id)
	wantFinal(t, final, "cancelled", "lease", 124)
	code, v = h.reconcileJSON(id)
	if code != 0 || v["outcome"] != "cancelled" {
		t.Errorf("reconcile after the watchdog: exit %d, %v; want exit 0, outcome cancelled", code, v)
	}
}
