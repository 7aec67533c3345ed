package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Nested runs: a run on "A" (this machine, its own run root)
// whose job runs `agent-wrap ssh B -- ...`, B being the test's sshd with a
// run root of its own, reached through the relay the test controls; for
// three levels, B's job runs `agent-wrap ssh C`, C the same sshd with a
// third root. Each level's record is read from its own root.

// trapTerm is a job that ignores TERM, so its stop takes the whole grace.
var trapTerm = []string{"sh", "-c", `trap "" TERM; echo started; sleep 300`}

// level is one host's run root, as a harness, with its cleanup.
func (c *ctlHarness) level(t *testing.T) *harness {
	h := &harness{t: t, srv: c.srv, root: t.TempDir()}
	t.Cleanup(h.killRuns)
	return h
}

// sshArgv is the argv of an `agent-wrap ssh` to c's host (its root, its
// ledger) through c's relay.
func (c *ctlHarness) sshArgv(id string, flags []string, argv ...string) []string {
	args := []string{bin, "ssh", "--rsh", c.rsh(), "--remote-bin", bin, "--remote-root", c.root,
		"--ledger", c.ledger, "--events", c.events, "--id", id}
	args = append(args, flags...)
	args = append(args, c.srv.Destination(), "--")
	return append(args, argv...)
}

// runLocal starts `agent-wrap --root ROOT run FLAGS ID -- ARGV` on this
// machine ("A"); cleanup kills its wrapper if it still runs.
func (h *harness) runLocal(id string, flags []string, argv ...string) *ctl {
	h.t.Helper()
	args := append([]string{"--root", h.root, "run"}, flags...)
	args = append(append(args, id, "--"), argv...)
	return startCtl(h.t, args)
}

// full reads a run's whole record, handoffs included.
func (h *harness) full(id string) statusfile.Record {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, id, "status.json"))
	if err != nil {
		h.t.Fatalf("run %s: %v", id, err)
	}
	r, err := statusfile.Parse(b)
	if err != nil {
		h.t.Fatalf("run %s: %v", id, err)
	}
	return *r
}

// waitHandoff waits until the run's record lists a handoff of inner that
// satisfies cond, and returns it.
func (h *harness) waitHandoff(id, inner, what string, cond func(statusfile.Handoff) bool) statusfile.Handoff {
	h.t.Helper()
	var got statusfile.Handoff
	h.waitState(id, "handoff "+inner+" "+what, func(record) bool {
		b, err := os.ReadFile(filepath.Join(h.root, id, "status.json"))
		if err != nil {
			return false
		}
		r, err := statusfile.Parse(b)
		if err != nil {
			return false
		}
		for _, ho := range r.Handoffs {
			if ho.RunID == inner && cond(ho) {
				got = ho
				return true
			}
		}
		return false
	})
	return got
}

// journal returns the run's journal events with their fields.
func (h *harness) journal(id string) []map[string]any {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, id, "events.jsonl"))
	if err != nil {
		h.t.Fatalf("reading journal: %v", err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			h.t.Fatalf("journal line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// firstEvent returns the index of the first event named name (-1: none).
func firstEvent(evs []map[string]any, name string) int {
	for i, e := range evs {
		if e["event"] == name {
			return i
		}
	}
	return -1
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return v
}

// cancelLocal runs `cancel --wait` on a run of this machine.
func (h *harness) cancelLocal(id string) (int, string) {
	h.t.Helper()
	out, err := execBin("--root", h.root, "cancel", "--wait", "60s", id)
	return exitCode(err), out
}

// wantHandoffStoppedFirst checks that the outer run journaled the
// handoff's end before its first signal, and that the inner run's final
// record is older than that signal.
func wantHandoffStoppedFirst(t *testing.T, outer *harness, outerID string, inner *harness, innerID string) {
	t.Helper()
	evs := outer.journal(outerID)
	ho, he, sig := firstEvent(evs, "handoff"), firstEvent(evs, "handoff_end"), firstEvent(evs, "signal_sent")
	if ho < 0 || he < ho || sig >= 0 && sig < he {
		t.Errorf("outer %s journal: handoff at %d, handoff_end at %d, first signal_sent at %d; want them in that order", outerID, ho, he, sig)
	}
	if sig >= 0 {
		signalled := parseTime(t, evs[sig]["at"].(string))
		ended := parseTime(t, inner.full(innerID).EndedAt)
		if !ended.Before(signalled) {
			t.Errorf("inner %s ended at %v, not before the outer %s signalled its group at %v", innerID, ended, outerID, signalled)
		}
	}
}

// Cancel the outer run: the inner run on B is cancelled and confirmed
// before the outer run signals its own group, and the outer's final record
// names it, cancelled.
func TestNestedCancelOuterStopsInnerFirst(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	a := c.level(t)
	k := a.runLocal("outer1", []string{"--lease", "120s", "--grace", "2s", "--handoff-grace", "30s"},
		c.sshArgv("inner1", []string{"--lease", "120s", "--grace", "2s"}, trapTerm...)...)
	runtest.Eventually(t, "the inner job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	c.waitRunning("inner1")
	a.waitHandoff("outer1", "inner1", "running with its lease end", func(h statusfile.Handoff) bool {
		return h.Outcome == statusfile.HandoffRunning && h.LeaseEndsAt != ""
	})

	start := time.Now()
	if code, out := a.cancelLocal("outer1"); code != 0 {
		t.Fatalf("cancel outer1: exit %d: %s", code, out)
	}
	t.Logf("cancel of the outer run confirmed in %v (inner grace 2s, its job ignores TERM)", time.Since(start).Round(time.Millisecond))
	if code := k.wait(t); code != 143 {
		t.Errorf("outer run exit %d, want 143", code)
	}
	inner := c.waitTerminal("inner1")
	wantFinal(t, inner, "cancelled", "cancel", 143)
	c.treeGone("inner1")
	c.wantSettled("inner1", "cancelled", "cancel", 143)

	rec := a.full("outer1")
	if rec.State != statusfile.Cancelled || len(rec.Handoffs) != 1 {
		t.Fatalf("outer final record: state %s, handoffs %+v; want cancelled with one handoff", rec.State, rec.Handoffs)
	}
	h := rec.Handoffs[0]
	if h.RunID != "inner1" || h.Dest != c.srv.Destination() || h.Outcome != "cancelled" || h.ExitCode == nil || *h.ExitCode != 143 || h.Learned != statusfile.HandoffByController {
		t.Errorf("outer record's handoff: %+v; want inner1 on %s cancelled 143, learned from its controller", h, c.srv.Destination())
	}
	wantHandoffStoppedFirst(t, a, "outer1", c.harness, "inner1")

	// reconcile on A names the handoff.
	out, _ := execBin("--root", a.root, "reconcile", "--json", "outer1")
	var v struct {
		Outcome  string               `json:"outcome"`
		Handoffs []statusfile.Handoff `json:"handoffs"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &v); err != nil || v.Outcome != "cancelled" || len(v.Handoffs) != 1 || v.Handoffs[0].Outcome != "cancelled" {
		t.Errorf("reconcile --json outer1: %s (%v); want cancelled, naming inner1 cancelled", out, err)
	}

	// show on A draws the handoff, the intent, the handoff's end and the
	// final record, in that order.
	out, err := execBin("--root", a.root, "show", "outer1")
	if err != nil {
		t.Fatalf("show outer1: %v\n%s", err, out)
	}
	dest := regexp.QuoteMeta(c.srv.Destination())
	reg := regexp.MustCompile(`(?m) wrapper handoff: run inner1 on ` + dest + ` \(controller pid \d+, lease \S+\)$`)
	end := regexp.MustCompile(`(?m) wrapper handoff ended: run inner1 on ` + dest + `: cancelled, exit 143, learned controller$`)
	intent := regexp.MustCompile(`(?m) INTENT cancel requested: cause cancel$`)
	final := regexp.MustCompile(`(?m) wrapper final: cancelled \(cancel\), exit 143, nothing survived$`)
	var at []int
	for _, re := range []*regexp.Regexp{reg, intent, end, final} {
		i := re.FindStringIndex(out)
		if i == nil || len(at) > 0 && i[0] < at[len(at)-1] {
			t.Errorf("show outer1: %s missing or out of order:\n%s", re, out)
			break
		}
		at = append(at, i[0])
	}
}

// The outer wrapper SIGKILLed (by its recorded PID): the inner
// controller, unable to ask it, stops renewing; then the rest of A is
// SIGKILLed too (the job's group, the inner controller). The inner run on
// B stops no later than the outer deadline plus the inner grace, because
// its lease was capped at the outer run's time left. settle on A's ledger
// says so. The outer lease passing is the subject here, so it is short.
func TestNestedOuterKilledInnerEndsByOuterDeadline(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	a := c.level(t)
	const innerGrace = 2 * time.Second
	a.runLocal("outer2", []string{"--lease", "10s", "--grace", "2s"},
		c.sshArgv("inner2", []string{"--lease", "120s", "--grace", "2s"}, trapTerm...)...)
	c.waitRunning("inner2")
	a.waitHandoff("outer2", "inner2", "with its lease end", func(h statusfile.Handoff) bool { return h.LeaseEndsAt != "" })
	if l := c.ledgerRec("inner2"); l.Lease >= 10 {
		t.Errorf("inner ledger lease %v s, want it capped below the outer's 10 s", l.Lease)
	}
	b, err := os.ReadFile(filepath.Join(a.root, "outer2", "deadline_epoch"))
	if err != nil {
		t.Fatal(err)
	}
	outerDeadline, err := lease.ParseDeadline(b)
	if err != nil {
		t.Fatal(err)
	}

	r, _ := a.status("outer2")
	if !proc.Alive(r.WrapperPID, r.WrapperStart) {
		t.Fatalf("outer wrapper %d not alive before the kill", r.WrapperPID)
	}
	// The wrapper alone first: the inner controller can no longer ask it,
	// and stops renewing.
	if err := syscall.Kill(r.WrapperPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the outer wrapper dead", func() bool { return !proc.Alive(r.WrapperPID, r.WrapperStart) })
	mark := len(c.ctlEvents("inner2"))
	c.waitEvent("inner2", "renew_failed", mark)
	if ev := c.lastEvent("inner2", "renew_failed"); ev["reason"] != "refused" || !strings.Contains(ev["error"].(string), "cannot be asked") {
		t.Errorf("renew_failed after the outer wrapper died: %v; want refused, the outer run cannot be asked", ev)
	}
	// Then the rest of A: the job's group, the inner controller.
	a.killRuns()
	waitGroupEmpty(t, r.PGID)

	inner := c.waitTerminal("inner2")
	wantFinal(t, inner, "cancelled", "lease", 124)
	ended := parseTime(t, c.full("inner2").EndedAt)
	// The bound: the inner grace after the outer deadline, plus the second
	// in which a wrapper sees a deadline moved closer (docs/reference.md,
	// renew): a launch that took over a second to reach B gets a deadline
	// rounded up past the outer one, and the next renewal moves it back.
	const notice = time.Second
	bound := time.Unix(outerDeadline, 0).Add(innerGrace + notice)
	t.Logf("inner run ended %v after the outer deadline (bound: the inner grace %v and a renewal's notice %v)",
		ended.Sub(time.Unix(outerDeadline, 0)).Round(time.Millisecond), innerGrace, notice)
	if ended.After(bound.Add(500 * time.Millisecond)) {
		t.Errorf("inner run ended at %v, later than the outer deadline %v plus the inner grace and a renewal's notice", ended, time.Unix(outerDeadline, 0))
	}
	c.treeGone("inner2")

	if code, out := c.settle("inner2"); code != 0 {
		t.Errorf("settle inner2: exit %d: %s", code, out)
	}
	c.wantSettled("inner2", "cancelled", "lease", 124)

	// The outer record (its wrapper died) still names the handoff, and
	// reconcile says where the rest of the work went.
	out, _ := execBin("--root", a.root, "reconcile", "outer2")
	if !strings.Contains(out, "inner2") {
		t.Errorf("reconcile outer2 does not name the handoff: %s", out)
	}
}

// The inner controller's connection to B blackholed: the outer run ends
// on time (handoff grace, then its own stop), its record names the handoff
// unknown with the inner lease end, and B's job stops by then.
func TestNestedBlackholedInnerUnknownWithLeaseEnd(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	a := c.level(t)
	const handoffGrace, grace, innerGrace = 2 * time.Second, 2 * time.Second, 2 * time.Second
	k := a.runLocal("outer3", []string{"--lease", "120s", "--grace", grace.String(), "--handoff-grace", handoffGrace.String()},
		c.sshArgv("inner3", []string{"--lease", "6s", "--grace", innerGrace.String(), "--renew-every", "2s"}, trapTerm...)...)
	runtest.Eventually(t, "the inner job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	c.waitEvent("inner3", "renewed", 0)
	c.rl.Blackhole(true)

	start := time.Now()
	if code, out := a.cancelLocal("outer3"); code != 0 {
		t.Fatalf("cancel outer3: exit %d: %s", code, out)
	}
	took := time.Since(start)
	t.Logf("outer run stopped in %v (handoff grace %v + grace %v)", took.Round(time.Millisecond), handoffGrace, grace)
	if took > handoffGrace+grace+5*time.Second {
		t.Errorf("the outer run took %v to stop, want about the handoff grace plus its grace", took)
	}
	rec := a.full("outer3")
	wantFinal(t, a.waitTerminal("outer3"), "cancelled", "cancel", 143)
	if len(rec.Handoffs) != 1 {
		t.Fatalf("outer handoffs: %+v", rec.Handoffs)
	}
	h := rec.Handoffs[0]
	if h.Outcome != statusfile.HandoffUnknown || h.Learned != statusfile.HandoffUnconfirmed || h.LeaseEndsAt == "" ||
		!strings.Contains(h.Remaining, "agent-wrap settle inner3") || !strings.Contains(h.Remaining, h.LeaseEndsAt) {
		t.Fatalf("outer record's handoff: %+v; want unknown, unconfirmed, with its lease end and settle named", h)
	}
	leaseEnd := parseTime(t, h.LeaseEndsAt)

	inner := c.waitTerminal("inner3")
	wantFinal(t, inner, "cancelled", "lease", 124)
	ended := parseTime(t, c.full("inner3").EndedAt)
	t.Logf("inner run on B ended %v before the recorded lease end plus its grace", leaseEnd.Add(innerGrace).Sub(ended).Round(time.Millisecond))
	if ended.After(leaseEnd.Add(innerGrace + 500*time.Millisecond)) {
		t.Errorf("inner run ended at %v, after the lease end %v the outer record names (plus its grace)", ended, leaseEnd)
	}
	c.treeGone("inner3")
	out, _ := execBin("--root", a.root, "reconcile", "outer3")
	if !strings.Contains(out, "agent-wrap settle inner3") {
		t.Errorf("reconcile outer3 does not name the remaining work: %s", out)
	}
}

// Three levels, A → B → C: cancelling A stops all three, innermost
// first, and each record names its child.
func TestNestedThreeLevelsInnermostFirst(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t) // B: the sshd with c.root
	a := c.level(t)
	cc := &ctlHarness{harness: c.level(t), rl: c.rl, ledger: filepath.Join(t.TempDir(), "ledger"), events: filepath.Join(t.TempDir(), "events.jsonl")}
	// B's job: agent-wrap ssh C, whose job ignores TERM; B's grace (its
	// handoff grace too) covers C's stop.
	bJob := cc.sshArgv("c4", []string{"--lease", "120s", "--grace", "2s"}, trapTerm...)
	k := a.runLocal("a4", []string{"--lease", "120s", "--grace", "2s", "--handoff-grace", "40s"},
		c.sshArgv("b4", []string{"--lease", "120s", "--grace", "20s"}, bJob...)...)
	runtest.Eventually(t, "the innermost job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	cc.waitRunning("c4")
	c.waitHandoff("b4", "c4", "running", func(h statusfile.Handoff) bool { return h.LeaseEndsAt != "" })
	a.waitHandoff("a4", "b4", "running", func(h statusfile.Handoff) bool { return h.LeaseEndsAt != "" })

	if code, out := a.cancelLocal("a4"); code != 0 {
		t.Fatalf("cancel a4: exit %d: %s", code, out)
	}
	if code := k.wait(t); code != 143 {
		t.Errorf("a4 exit %d, want 143", code)
	}
	ra, rb, rc := a.full("a4"), c.full("b4"), cc.full("c4")
	for _, x := range []struct {
		rec   statusfile.Record
		child string
	}{{ra, "b4"}, {rb, "c4"}} {
		if x.rec.State != statusfile.Cancelled || len(x.rec.Handoffs) != 1 || x.rec.Handoffs[0].RunID != x.child || x.rec.Handoffs[0].Outcome != "cancelled" {
			t.Errorf("run %s: state %s, handoffs %+v; want cancelled, naming %s cancelled", x.rec.RunID, x.rec.State, x.rec.Handoffs, x.child)
		}
	}
	if rc.State != statusfile.Cancelled || len(rc.Handoffs) != 0 {
		t.Errorf("c4: state %s, handoffs %+v", rc.State, rc.Handoffs)
	}
	ta, tb, tc := parseTime(t, ra.EndedAt), parseTime(t, rb.EndedAt), parseTime(t, rc.EndedAt)
	t.Logf("ended: c4 %v, b4 +%v, a4 +%v", tc.Format(time.StampMilli), tb.Sub(tc).Round(time.Millisecond), ta.Sub(tb).Round(time.Millisecond))
	if !tc.Before(tb) || !tb.Before(ta) {
		t.Errorf("end order: c4 %v, b4 %v, a4 %v; want innermost first", tc, tb, ta)
	}
	wantHandoffStoppedFirst(t, a, "a4", c.harness, "b4")
	wantHandoffStoppedFirst(t, c.harness, "b4", cc.harness, "c4")
	cc.treeGone("c4")
	c.treeGone("b4")
	cc.wantSettled("c4", "cancelled", "cancel", 143)
	c.wantSettled("b4", "cancelled", "cancel", 143)
}

// A registration the outer run refuses (it is ending) launches nothing:
// the inner controller exits 75 and its ledger says not_started.
func TestNestedRefusedWhileOuterEnds(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	a := c.level(t)
	// The outer job ignores TERM; once its stop has begun (cancelling), it
	// starts an inner run, which must be refused.
	gate := filepath.Join(t.TempDir(), "go")
	inner := strings.Join(shellWords(c.sshArgv("late", []string{"--lease", "120s"}, "true")), " ")
	job := []string{"sh", "-c", `trap "" TERM; echo started; while [ ! -e "$1" ]; do sleep 0.05; done; ` + inner + `; echo "inner exit $?"; sleep 300`, "sh", gate}
	k := a.runLocal("outer5", []string{"--lease", "120s", "--grace", "3s"}, job...)
	runtest.Eventually(t, "the outer job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	cancel := exec.Command(bin, "--root", a.root, "cancel", "--wait", "60s", "outer5")
	if err := cancel.Start(); err != nil {
		t.Fatal(err)
	}
	a.waitState("outer5", "cancelling", func(r record) bool { return r.State == "cancelling" })
	// The gate opens once the TERM has been sent: an inner controller
	// started before it would take the TERM as its own cancel (143).
	runtest.Eventually(t, "the outer run's TERM", func() bool { return firstEvent(a.journal("outer5"), "signal_sent") >= 0 })
	os.WriteFile(gate, nil, 0o600)
	runtest.Eventually(t, "the inner controller's exit", func() bool { return strings.Contains(k.stdout(), "inner exit ") })
	if !strings.Contains(k.stdout(), "inner exit 75\n") {
		t.Errorf("inner controller: %q, want exit 75", k.stdout())
	}
	if err := cancel.Wait(); err != nil {
		t.Errorf("cancel outer5: %v", err)
	}
	if l := c.ledgerRec("late"); l.State != ledger.Settled || l.Outcome != ledger.NotStarted {
		t.Errorf("ledger late: %s %s (%s); want settled not_started", l.State, l.Outcome, l.Reason)
	}
	if _, err := c.status("late"); err == nil {
		t.Errorf("the refused run exists on the host")
	}
}

// shellWords quotes argv for sh -c.
func shellWords(argv []string) []string {
	out := make([]string, len(argv))
	for i, w := range argv {
		out[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return out
}

// The outer lease moved closer (renew --lease with a shorter lease): the
// inner run's lease follows at once, so it still ends no later than the
// outer deadline.
func TestNestedOuterLeaseShortenedInnerFollows(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	a := c.level(t)
	k := a.runLocal("outer6", []string{"--lease", "120s", "--grace", "2s", "--handoff-grace", "30s"},
		c.sshArgv("inner6", []string{"--lease", "120s", "--grace", "2s"}, "sleep", "300")...)
	c.waitRunning("inner6")
	a.waitHandoff("outer6", "inner6", "with its lease end", func(h statusfile.Handoff) bool { return h.LeaseEndsAt != "" })
	deadline := func(root, id string) int64 {
		b, err := os.ReadFile(filepath.Join(root, id, "deadline_epoch"))
		if err != nil {
			return 0
		}
		dl, _ := lease.ParseDeadline(b)
		return dl
	}
	if out, err := execBin("--root", a.root, "renew", "--lease", "20s", "outer6"); err != nil {
		t.Fatalf("renew outer6: %v: %s", err, out)
	}
	outer := deadline(a.root, "outer6")
	runtest.Eventually(t, "the inner deadline at or before the outer one", func() bool {
		dl := deadline(c.root, "inner6")
		return dl > 0 && dl <= outer
	})
	t.Logf("outer deadline %d, inner deadline %d", outer, deadline(c.root, "inner6"))
	if code, out := a.cancelLocal("outer6"); code != 0 {
		t.Fatalf("cancel outer6: exit %d: %s", code, out)
	}
	k.wait(t)
	wantFinal(t, c.waitTerminal("inner6"), "cancelled", "cancel", 143)
	c.treeGone("inner6")
}

// lastEvent returns the fields of run id's last controller event name.
func (c *ctlHarness) lastEvent(id, name string) map[string]any {
	b, _ := os.ReadFile(c.events)
	var last map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["run_id"] == id && m["event"] == name {
			last = m
		}
	}
	return last
}
