//go:build linux

package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// verdict runs `reconcile --json ID` and decodes its one line.
func verdict(t *testing.T, root, id string) (int, reconcile.Verdict) {
	t.Helper()
	code, out, errOut := runtest.Exec(t, root, "reconcile", "--json", id)
	var v reconcile.Verdict
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &v); err != nil {
		t.Fatalf("reconcile --json %s: exit %d, not one JSON line: %v\nstdout: %s\nstderr: %s", id, code, err, out, errOut)
	}
	return code, v
}

// wantVerdict fails unless reconcile exits code with outcome and
// supervisor, and its reason contains every one of reason.
func wantVerdict(t *testing.T, root, id string, code int, outcome, supervisor string, reason ...string) reconcile.Verdict {
	t.Helper()
	got, v := verdict(t, root, id)
	if got != code || v.Outcome != outcome || v.Supervisor != supervisor {
		t.Fatalf("reconcile %s: exit %d, outcome %s, supervisor %s; want %d, %s, %s\nreason: %s", id, got, v.Outcome, v.Supervisor, code, outcome, supervisor, v.Reason)
	}
	for _, s := range reason {
		if !strings.Contains(v.Reason, s) {
			t.Fatalf("reconcile %s: reason %q lacks %q", id, v.Reason, s)
		}
	}
	return v
}

// killWrapper SIGKILLs the run's wrapper (started by the test) and waits for
// it to be gone.
func killWrapper(t *testing.T, c *runtest.Cmd, rec *statusfile.Record) {
	t.Helper()
	if err := unix.Kill(rec.WrapperPID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.Wait(t)
}

// editRecord rewrites fields of status.json behind agent-wrap's back, as a
// crash, a reboot or a tamperer would leave it (atomically, like the
// wrapper, so no reader sees a torn file).
func editRecord(t *testing.T, r runtest.Run, edit func(m map[string]any)) {
	t.Helper()
	path := filepath.Join(r.Dir(), "status.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(path+".edit", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".edit", path); err != nil {
		t.Fatal(err)
	}
}

// cleanupRun kills what is left of each run at the end of the test (by its
// recorded group and PIDs) and then removes the run's cgroup, which a
// wrapper SIGKILLed by a test never gets to remove.
func cleanupRun(t *testing.T, runs ...runtest.Run) {
	t.Cleanup(func() {
		for _, r := range runs {
			r.Kill()
			rec := r.Status()
			if rec == nil || !cgroup.Valid(rec.Cgroup) {
				continue
			}
			runtest.Within(10*time.Second, func() bool {
				pids, _ := cgroup.Procs(rec.Cgroup)
				return len(pids) == 0 && cgroup.Remove(rec.Cgroup) == nil
			})
		}
	})
}

func memberPIDs(v reconcile.Verdict) []int {
	var out []int
	for _, m := range v.Evidence.Members {
		out = append(out, m.PID)
	}
	return out
}

// A job that ignores TERM, grace 60s: the wrapper is TERMed (cancelling),
// then SIGKILLed while it waits out the grace. The job runs on with no
// supervisor: running, supervisor lost, and the reason says it was
// cancelling. cancel --grace 1s then stops it itself and confirms it, and
// reconcile says cancelled.
func TestReconcileSupervisorLostWhileCancelling(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "lost", "--grace", "60s", "lost", "--",
		"sh", "-c", `trap "" TERM; sleep 300; echo never`)
	cleanupRun(t, r)
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "sleep in the group", func() bool { return len(runtest.Members(rec.PGID)) >= 2 })
	if err := unix.Kill(rec.WrapperPID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r.WaitState(t, statusfile.Cancelling)
	runtest.Eventually(t, "TERM sent to the group", func() bool {
		return strings.Contains(r.File("events.jsonl"), `"event":"signal_sent"`)
	})
	killWrapper(t, c, rec)

	v := wantVerdict(t, root, "lost", 3, reconcile.Running, reconcile.SupervisorLost,
		"supervisor lost", "cancelling (cause signal:TERM)")
	if v.ExitCode != nil || v.Evidence.WrapperAlive || v.Evidence.State != statusfile.Cancelling || len(v.Evidence.Members) < 2 {
		t.Fatalf("evidence: %+v", v)
	}
	if pids := memberPIDs(v); !containsInt(pids, rec.PID) {
		t.Fatalf("members %v lack the leader %d", pids, rec.PID)
	}
	if code, _, errOut := runtest.Exec(t, root, "reconcile", "lost"); code != 3 || errOut != "" {
		t.Fatalf("human reconcile: exit %d, stderr %q", code, errOut)
	}

	if code, out, errOut := runtest.Exec(t, root, "cancel", "--grace", "1s", "--wait", "20s", "lost"); code != 0 {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, errOut)
	}
	r.AssertGroupEmpty(t)
	v = wantVerdict(t, root, "lost", 0, reconcile.Cancelled, reconcile.SupervisorNone, "cause signal:TERM")
	if v.ExitCode == nil || *v.ExitCode != 143 || len(v.Evidence.Members) != 0 {
		t.Fatalf("verdict: exit_code %v, members %v; want 143 and none", v.ExitCode, v.Evidence.Members)
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// The wrapper is SIGKILLed and the group killed behind its back: nothing of
// the run is alive and there is no final record. Unknown, saying the
// supervisor died before a final record and whether it was cancelling. Two
// runs side by side: one running, one cancelling when its wrapper died.
func TestReconcileSupervisorDiedGroupGone(t *testing.T) {
	root := runtest.NewRoot(t)
	c1, r1 := startRun(t, root, "plain", "plain", "--", "sleep", "300")
	c2, r2 := startRun(t, root, "midstop", "--grace", "60s", "midstop", "--",
		"sh", "-c", `trap "" TERM; sleep 300; echo never`)
	cleanupRun(t, r1, r2)
	rec1 := r1.WaitState(t, statusfile.Running)
	rec2 := r2.WaitState(t, statusfile.Running)
	if err := unix.Kill(rec2.WrapperPID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r2.WaitState(t, statusfile.Cancelling)
	killWrapper(t, c1, rec1)
	killWrapper(t, c2, rec2)
	for _, rec := range []*statusfile.Record{rec1, rec2} {
		if err := unix.Kill(-rec.PGID, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		runtest.Eventually(t, "the group to die", func() bool { return len(runtest.Members(rec.PGID)) == 0 })
	}

	v := wantVerdict(t, root, "plain", 4, reconcile.Unknown, reconcile.SupervisorLost,
		"supervisor died before a final record", "running, not cancelling")
	if v.ExitCode != nil || len(v.Evidence.Members) != 0 || v.Evidence.State != statusfile.Running {
		t.Fatalf("evidence: %+v", v)
	}
	wantVerdict(t, root, "midstop", 4, reconcile.Unknown, reconcile.SupervisorLost,
		"supervisor died before a final record", "cancelling (cause signal:TERM)")

	// Both at once: unknown wins.
	code, out, _ := runtest.Exec(t, root, "reconcile", "plain", "midstop")
	if code != 4 || strings.Count(out, "\n") != 2 {
		t.Fatalf("reconcile plain midstop: exit %d\n%s", code, out)
	}
}

// cancelled in status.json, but a process of the run is alive: cleanup is
// not confirmed, so the outcome is unknown, naming the PID.
func TestReconcileCancelledButMemberAlive(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "liar", "liar", "--", "sleep", "300")
	cleanupRun(t, r)
	rec := r.WaitState(t, statusfile.Running)
	killWrapper(t, c, rec)
	editRecord(t, r, func(m map[string]any) {
		m["state"], m["cause"], m["exit_code"], m["survivors"] = "cancelled", "cancel", 143, []int{}
	})
	v := wantVerdict(t, root, "liar", 4, reconcile.Unknown, reconcile.SupervisorNone,
		"cleanup is not confirmed", "PID "+itoa(rec.PID)+" (sleep) is still alive")
	if v.ExitCode != nil || !containsInt(memberPIDs(v), rec.PID) {
		t.Fatalf("verdict: %+v", v)
	}
	// gc never removes it.
	if code, out, _ := runtest.Exec(t, root, "gc", "--older-than", "0s"); code != 0 || out != "" {
		t.Fatalf("gc: exit %d, removed %q", code, out)
	}
	if r.Status() == nil {
		t.Fatal("gc removed a run whose cleanup is not confirmed")
	}
}

// boot_id rewritten: the record is from another boot, so none of its PIDs
// mean anything; unknown, host rebooted, even though a process with the
// recorded PID runs.
func TestReconcileBootChanged(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "reboot", "reboot", "--", "sleep", "300")
	cleanupRun(t, r)
	rec := r.WaitState(t, statusfile.Running)
	killWrapper(t, c, rec)
	editRecord(t, r, func(m map[string]any) { m["boot_id"] = "00000000-0000-4000-8000-000000000000" })
	v := wantVerdict(t, root, "reboot", 4, reconcile.Unknown, reconcile.SupervisorLost,
		"host rebooted", "00000000-0000-4000-8000-000000000000")
	if !v.Evidence.BootChanged || len(v.Evidence.Members) != 0 {
		t.Fatalf("evidence: boot_changed %v, members %v", v.Evidence.BootChanged, v.Evidence.Members)
	}
	if !proc.Alive(rec.PID, 0) {
		t.Fatalf("the job %d should still run: reconcile must not touch it", rec.PID)
	}
}

func itoa(v int) string { return strconv.Itoa(v) }
