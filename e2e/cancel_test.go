package e2e

import (
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// treeJob starts two children in the job's group, then waits for them.
const treeJob = `sleep 300 & sleep 300 & echo started; wait`

// waitMembers waits until the run's group has n live members and returns them.
func waitMembers(t *testing.T, pgid, n int) []proc.Stat {
	t.Helper()
	var m []proc.Stat
	runtest.Eventually(t, "the job's children to start", func() bool {
		m = runtest.Members(pgid)
		return len(m) == n
	})
	return m
}

// startTree runs treeJob as run id over ssh (lease 60s, grace 2s) and
// waits for its "started" line, its running record and its group's three
// members, which it returns with the stream.
func (h *harness) startTree(id string) (*stream, record, []proc.Stat) {
	h.t.Helper()
	s := h.start(nil, "run", "--lease", "60s", "--grace", "2s", id, "--", "sh", "-c", treeJob)
	runtest.Eventually(h.t, "the job's first line over ssh", func() bool { return strings.Contains(s.stdout(), "started\n") })
	r := h.waitRunning(id)
	return s, r, waitMembers(h.t, r.PGID, 3)
}

// `cancel` over a second connection while the first streams:
// the first connection ends with exit 143, the record says cancelled, and no
// process of the group is left.
func TestCancelOverSecondConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "cancel-second"
	s, r, members := h.startTree(id)

	if c := h.ssh("cancel", "--wait", "20s", id); c.code != 0 {
		t.Errorf("cancel over a second connection: exit %d, want 0\nstdout: %s\nstderr: %s", c.code, c.stdout, c.stderr)
	}
	if code := s.wait(t); code != 143 {
		t.Errorf("the streaming connection ended with %d, want 143\nstderr: %s", code, s.stderr())
	}
	final, err := h.status(id)
	if err != nil {
		t.Fatal(err)
	}
	wantFinal(t, final, "cancelled", "cancel", 143)
	waitGroupEmpty(t, r.PGID)
	for _, m := range members {
		if proc.Alive(m.PID, m.Start) {
			t.Errorf("member %d alive after cancel", m.PID)
		}
	}
	ev := h.events(id)
	for _, want := range []string{"cancel_requested", "signal_sent", "final"} {
		if !contains(ev, want) {
			t.Errorf("journal lacks %q: %v", want, ev)
		}
	}
	code, v := h.reconcileJSON(id)
	if code != 0 || v["outcome"] != "cancelled" {
		t.Errorf("reconcile: exit %d, %v; want exit 0, outcome cancelled", code, v)
	}
}

// Two runs on one account; cancelling one over ssh leaves every
// process of the other alive.
func TestCancelLeavesOtherRunAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	sa, ra, _ := h.startTree("victim")
	sb, rb, bMembers := h.startTree("bystander")
	if ra.PGID == rb.PGID || ra.SID == rb.SID {
		t.Fatalf("the two runs share a group or session: %v / %v", ra, rb)
	}

	if c := h.ssh("cancel", "--wait", "20s", "victim"); c.code != 0 {
		t.Errorf("cancel victim: exit %d, want 0\nstderr: %s", c.code, c.stderr)
	}
	if code := sa.wait(t); code != 143 {
		t.Errorf("victim's connection ended with %d, want 143", code)
	}
	waitGroupEmpty(t, ra.PGID)

	for _, m := range bMembers {
		if !proc.Alive(m.PID, m.Start) {
			t.Errorf("bystander's process %d died when the victim was cancelled", m.PID)
		}
	}
	if !proc.Alive(rb.WrapperPID, rb.WrapperStart) {
		t.Errorf("bystander's wrapper %d died", rb.WrapperPID)
	}
	if st, err := h.status("bystander"); err != nil || st.State != "running" {
		t.Errorf("bystander's record: %v (err %v), want running", st, err)
	}
	select {
	case <-sb.done:
		t.Errorf("bystander's streaming connection ended: %v", sb.err)
	default:
	}

	// Then the bystander too, so the test leaves nothing behind.
	if c := h.ssh("cancel", "--wait", "20s", "bystander"); c.code != 0 {
		t.Errorf("cancel bystander: exit %d, want 0\nstderr: %s", c.code, c.stderr)
	}
	if code := sb.wait(t); code != 143 {
		t.Errorf("bystander's connection ended with %d, want 143", code)
	}
	waitGroupEmpty(t, rb.PGID)
}
