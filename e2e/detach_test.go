package e2e

import (
	"encoding/json"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// `run --detach` over `ssh -tt`: the connection ends as soon as the run is
// running (the supervisor, in its own session, must not hold the
// connection's terminal or pipes open, or ssh would wait for it), the
// terminal's hangup does not reach it, and a controller then follows, cancels
// and waits for the run over further connections. The final cause "cancel"
// (not "signal:HUP") proves the hangup did not cancel the run.
func TestDetachOverSSH(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "detached"
	det := h.start([]string{"-tt"}, "run", "--detach", "--lease", "60s", "--grace", "1s", id, "--", "sh", "-c", "echo begin; sleep 300")
	if code := det.wait(t); code != 0 {
		t.Fatalf("run --detach over ssh -tt: exit %d\nstdout: %s", code, det.stdout())
	}
	var printed record
	if err := json.Unmarshal([]byte(det.stdout()), &printed); err != nil || printed.State != "running" {
		t.Fatalf("run --detach printed %q (%v); want its record in state running", det.stdout(), err)
	}
	r := h.waitRunning(id)
	if !proc.Alive(r.WrapperPID, r.WrapperStart) || !proc.Alive(r.PID, r.LeaderStart) {
		t.Fatalf("after the detaching connection ended: wrapper alive %v, job alive %v; want both",
			proc.Alive(r.WrapperPID, r.WrapperStart), proc.Alive(r.PID, r.LeaderStart))
	}

	follow := h.start(nil, "logs", "-f", id)
	waiter := h.start(nil, "wait", "--timeout", "25s", id)
	runtest.Eventually(t, "logs -f to print the job's first line", func() bool { return follow.stdout() == "begin\n" })

	if c := h.ssh("cancel", "--wait", "20s", id); c.code != 0 {
		t.Errorf("cancel: exit %d, want 0\nstderr: %s", c.code, c.stderr)
	}
	if code := waiter.wait(t); code != 143 {
		t.Errorf("wait over ssh: exit %d, want 143\nstderr: %s", code, waiter.stderr())
	}
	if code := follow.wait(t); code != 0 || follow.stdout() != "begin\n" {
		t.Errorf("logs -f over ssh: exit %d, output %q; want 0 and %q", code, follow.stdout(), "begin\n")
	}
	final, err := h.status(id)
	if err != nil {
		t.Fatal(err)
	}
	wantFinal(t, final, "cancelled", "cancel", 143)
	waitGroupEmpty(t, r.PGID)
}
