package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// printer is a job that prints a numbered line every 50 ms, forever.
const printer = `i=0; while :; do i=$((i+1)); echo "line $i"; sleep 0.05; done`

// logSize returns the size of the run's stdout.log, or -1.
func (h *harness) logSize(id string) int64 {
	fi, err := os.Stat(filepath.Join(h.root, id, "stdout.log"))
	if err != nil {
		return -1
	}
	return fi.Size()
}

// disconnect SIGKILLs the local ssh client of s, as a crashing controller
// would be, and waits until the sshd processes of that connection (the
// wrapper's ancestors below the listener) are gone: from then on the wrapper's
// stdout and stderr lead nowhere.
func (h *harness) disconnect(s *stream, r record) {
	h.t.Helper()
	conn := ancestors(r.WrapperPID, h.srv.PID())
	if len(conn) == 0 {
		h.t.Fatalf("found no sshd process between wrapper %d and the listener %d", r.WrapperPID, h.srv.PID())
	}
	s.kill(h.t)
	for _, p := range conn {
		runtest.Eventually(h.t, "the connection's sshd processes to exit", func() bool { return !proc.Alive(p.PID, p.Start) })
	}
	h.t.Logf("client killed; the connection's sshd processes %v are gone", pids(conn))
}

func pids(ps []proc.Stat) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID
	}
	return out
}

// stillRunsAfterDisconnect checks that, with the connection gone, the job
// still writes its log and both the job and the wrapper are alive (the
// wrapper has had output to write into the closed pipe, so SIGPIPE would have
// killed it had it not ignored it). The checks only mean something before the
// lease ends, so a machine too slow to make them in time fails loudly.
func (h *harness) stillRunsAfterDisconnect(id string, r record, deadline time.Time) {
	h.t.Helper()
	size := h.logSize(id)
	runtest.Eventually(h.t, "stdout.log to grow after the disconnect", func() bool { return h.logSize(id) >= size+int64(3*len("line 99\n")) })
	var bad []string
	if !proc.Alive(r.WrapperPID, r.WrapperStart) {
		bad = append(bad, fmt.Sprintf("wrapper %d died after the disconnect (SIGPIPE?)", r.WrapperPID))
	}
	if !proc.Alive(r.PID, r.LeaderStart) {
		bad = append(bad, fmt.Sprintf("job leader %d died after the disconnect", r.PID))
	}
	if st, err := h.status(id); err != nil || st.State != "running" {
		bad = append(bad, fmt.Sprintf("after the disconnect: record %v (err %v), want state running", st, err))
	}
	if time.Now().After(deadline) {
		h.t.Fatalf("the checks after the disconnect ended after the lease's deadline: machine too slow, result inconclusive %q", bad)
	}
	for _, b := range bad {
		h.t.Error(b)
	}
}

// endLease ends a run's lease on demand with `renew --lease 1s` over ssh, and
// returns the new deadline: a test starts a run with a long lease, makes its
// checks while the run must be alive, then ends it, never racing the clock.
func (h *harness) endLease(id string) time.Time {
	h.t.Helper()
	if res := h.ssh("renew", "--lease", "1s", id); res.code != 0 {
		h.t.Fatalf("renew --lease 1s %s: exit %d\nstderr: %s", id, res.code, res.stderr)
	}
	return h.leaseDeadline(id)
}

// leaseDeadline reads deadline_epoch.
func (h *harness) leaseDeadline(id string) time.Time {
	n := readInt(filepath.Join(h.root, id, "deadline_epoch"))
	if n == 0 {
		h.t.Fatalf("run %s: no deadline_epoch", id)
	}
	return time.Unix(int64(n), 0)
}

// No PTY, a lease, a job printing continuously, the local ssh
// client SIGKILLed: losing the stream is not a hangup, so the job runs on past
// the disconnect, the wrapper survives writing into the dead pipe, the lease
// then stops the job (ended on demand once the checks are made), and
// reconcile over a new connection says cancelled.
func TestDisconnectNoPTYRunsUntilLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "nopty-disconnect"
	s := h.start(nil, "run", "--lease", "5m", "--grace", "1s", id, "--", "sh", "-c", printer)
	runtest.Eventually(t, "streamed lines over ssh", func() bool { return strings.Count(s.stdout(), "\n") >= 3 })
	r := h.waitRunning(id)
	deadline := h.leaseDeadline(id)

	h.disconnect(s, r)
	h.stillRunsAfterDisconnect(id, r, deadline)
	// Reattach over new connections while the run lives on.
	checkReattach := h.reattach(id)

	h.endLease(id)
	final := h.waitTerminal(id)
	wantFinal(t, final, "cancelled", "lease", 124)
	waitGroupEmpty(t, r.PGID)
	if proc.Alive(r.PID, r.LeaderStart) {
		t.Errorf("job leader %d alive after the lease ended", r.PID)
	}
	// The journal's final event may follow the terminal status.json; the
	// wrapper has written both once it has exited.
	runtest.Eventually(t, "the wrapper to exit after its final record", func() bool { return !proc.Alive(r.WrapperPID, r.WrapperStart) })
	ev := h.events(id)
	for _, want := range []string{"stream_lost", "deadline_expired", "final"} {
		if !contains(ev, want) {
			t.Errorf("journal lacks %q: %v", want, ev)
		}
	}

	code, v := h.reconcileJSON(id)
	if code != 0 || v["outcome"] != "cancelled" {
		t.Errorf("reconcile over a new connection: exit %d, %v; want exit 0, outcome cancelled", code, v)
	}
	checkReattach(124)
}

// reattach starts what a controller that lost its
// connection does next: `logs -f` and `wait` over new connections. The
// returned func, called once the run is terminal, checks that `logs -f`
// followed to the end and printed stdout.log byte for byte, and that `wait`
// exited with code. (Should the run end before the new connections are up,
// both must still say the same.)
func (h *harness) reattach(id string) func(code int) {
	h.t.Helper()
	follow := h.start(nil, "logs", "-f", id)
	waiter := h.start(nil, "wait", "--timeout", "60s", id)
	var live bool
	runtest.Eventually(h.t, "logs -f to print or the run to end", func() bool {
		st, err := h.status(id)
		live = err == nil && !st.terminal()
		return follow.stdout() != "" || !live
	})
	h.t.Logf("logs -f attached while the run was live: %v", live)
	return func(code int) {
		h.t.Helper()
		got := follow.wait(h.t)
		want, err := os.ReadFile(filepath.Join(h.root, id, "stdout.log"))
		if err != nil {
			h.t.Fatal(err)
		}
		if out := follow.stdout(); got != 0 || out != string(want) {
			h.t.Errorf("logs -f %s over ssh: exit %d, %d bytes; want exit 0 and stdout.log's %d bytes\nstderr: %s",
				id, got, len(out), len(want), follow.stderr())
		}
		if got := waiter.wait(h.t); got != code {
			h.t.Errorf("wait %s over ssh: exit %d, want %d\nstderr: %s", id, got, code, waiter.stderr())
		}
	}
}

// `ssh -tt`, the client killed: sshd closes the PTY, the kernel
// hangs it up, the wrapper (session leader on that terminal) gets SIGHUP and,
// by default, cancels the run.
func TestDisconnectPTYHangupCancels(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "pty-hangup"
	s := h.start([]string{"-tt"}, "run", "--lease", "60s", "--grace", "1s", id, "--", "sh", "-c", printer)
	runtest.Eventually(t, "streamed lines over ssh", func() bool { return strings.Count(s.stdout(), "\n") >= 3 })
	r := h.waitRunning(id)

	h.disconnect(s, r)

	final := h.waitTerminal(id)
	wantFinal(t, final, "cancelled", "signal:HUP", 129)
	waitGroupEmpty(t, r.PGID)
	code, v := h.reconcileJSON(id)
	if code != 0 || v["outcome"] != "cancelled" {
		t.Errorf("reconcile: exit %d, %v; want exit 0, outcome cancelled", code, v)
	}
}

// The same hangup with --on-hangup ignore: the job lives on
// until its lease ends (on demand, once the checks are made).
func TestDisconnectPTYHangupIgnored(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "pty-ignore"
	s := h.start([]string{"-tt"}, "run", "--lease", "5m", "--grace", "1s", "--on-hangup", "ignore", id, "--", "sh", "-c", printer)
	runtest.Eventually(t, "streamed lines over ssh", func() bool { return strings.Count(s.stdout(), "\n") >= 3 })
	r := h.waitRunning(id)
	deadline := h.leaseDeadline(id)

	h.disconnect(s, r)
	h.stillRunsAfterDisconnect(id, r, deadline)

	h.endLease(id)
	final := h.waitTerminal(id)
	wantFinal(t, final, "cancelled", "lease", 124)
	waitGroupEmpty(t, r.PGID)
}
