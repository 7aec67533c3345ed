package e2e

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// `agent-wrap ssh` end to end: bytes and codes, a confirmed cancel, a
// reattach, blackholes shorter and longer than the lease, the controller
// killed, two controllers, an unreachable host, then bad input and the
// controller killed at each moment. Leases are long and ended on demand,
// except where the lease passing is the subject (a blackhole past the
// lease, the controller killed).

var longLease = []string{"--lease", "120s", "--grace", "2s"}

// Bytes and codes: 10 MB of binary stdout and 1 MB of stderr arrive
// byte-identical; exit codes 0, 7, 127 and a signal death pass through;
// a hostile argv arrives exact.
func TestSSHBytesCodesArgv(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	dir := t.TempDir()
	outData, errData := make([]byte, 10<<20), make([]byte, 1<<20)
	rand.Read(outData)
	rand.Read(errData)
	outF, errF := filepath.Join(dir, "out.bin"), filepath.Join(dir, "err.bin")
	os.WriteFile(outF, outData, 0o600)
	os.WriteFile(errF, errData, 0o600)

	k := c.start("bytes", longLease, "sh", "-c", `cat "$1"; cat "$2" >&2`, "sh", outF, errF)
	if code := k.wait(t); code != 0 {
		t.Fatalf("exit %d, want 0; stderr tail: %q", code, tail(k.stderr()))
	}
	if got := k.stdout(); got != string(outData) {
		t.Errorf("stdout: %d bytes, want the 10 MB byte for byte", len(got))
	}
	if got := k.stderr(); got != string(errData) {
		t.Errorf("stderr: %d bytes, want the 1 MB byte for byte (controller words must not mix in)", len(got))
	}
	c.wantSettled("bytes", "completed", "", 0)
	c.treeGone("bytes")

	for _, tc := range []struct {
		id   string
		argv []string
		code int
	}{
		{"code7", []string{"sh", "-c", "exit 7"}, 7},
		{"code127", []string{"/no/such/command"}, 127},
		{"codesig", []string{"sh", "-c", "kill -KILL $$"}, 137},
	} {
		k := c.start(tc.id, longLease, tc.argv...)
		if code := k.wait(t); code != tc.code {
			t.Errorf("%s: exit %d, want %d; stderr: %s", tc.id, code, tc.code, k.stderr())
		}
		c.wantSettled(tc.id, "completed", "", tc.code)
	}

	// No lease: nothing to renew; the run still ends with its code.
	k = c.start("nolease", []string{"--lease", "0"}, "sh", "-c", "echo hi; exit 3")
	if code := k.wait(t); code != 3 || k.stdout() != "hi\n" {
		t.Errorf("--lease 0: exit %d, stdout %q; want 3, hi", code, k.stdout())
	}
	if r, _ := c.status("nolease"); r.State != "finished" {
		t.Errorf("--lease 0: host record %v", r)
	}
	c.wantSettled("nolease", "completed", "", 3)

	hostile := []string{"two words", `it's "quoted"`, "$HOME", "a;b", `back\slash`, "line\nbreak", "", "-n", "--", "\xff\xfe\x80", "*", "`id`"}
	k = c.start("argv", longLease, append([]string{"/usr/bin/printf", `%s\000`}, hostile...)...)
	if code := k.wait(t); code != 0 {
		t.Fatalf("argv: exit %d: %s", code, k.stderr())
	}
	want := strings.Join(hostile, "\x00") + "\x00"
	if got := k.stdout(); got != want {
		t.Errorf("argv arrived as %q, want %q", got, want)
	}
}

// sleepTree is a job with two children in its group, printing "started".
var sleepTree = []string{"sh", "-c", `sleep 300 & sleep 300 & echo started; wait`}

// SIGINT to the controller: a confirmed cancel over a second connection.
func TestSSHInterruptCancels(t *testing.T) {
	eachLedger(t, testSSHInterruptCancels)
}

func testSSHInterruptCancels(t *testing.T, c *ctlHarness) {
	k := c.start("int", longLease, sleepTree...)
	runtest.Eventually(t, "the job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	r := c.waitRunning("int")
	waitMembers(t, r.PGID, 3)
	if l := c.ledgerRec("int"); l.State != ledger.Running || l.RemotePID != r.PID || l.BootID == "" {
		t.Errorf("ledger while the job runs: state %s remote_pid %d boot_id %q; want running, %d", l.State, l.RemotePID, l.BootID, r.PID)
	}
	k.signal(t, syscall.SIGINT)
	if code := k.wait(t); code != 143 {
		t.Errorf("controller exit %d, want 143 (the run's)\nstderr: %s", code, k.stderr())
	}
	wantFinal(t, c.waitTerminal("int"), "cancelled", "cancel", 143)
	c.treeGone("int")
	c.wantSettled("int", "cancelled", "cancel", 143)
	ev := c.ctlEvents("int")
	for _, e := range []string{"launching", "running", "cancel_requested", "cancel_confirmed", "settled"} {
		if !contains(ev, e) {
			t.Errorf("events lack %q: %v", e, ev)
		}
	}
}

// lineJob prints N numbered lines on each stream, slowly enough to be
// interrupted, then exits 0.
func lineJob(n int) []string {
	return []string{"sh", "-c", `i=0; while [ $i -lt ` + strconv.Itoa(n) + ` ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); sleep 0.01; done`}
}

func lineWant(prefix string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(prefix + " " + strconv.Itoa(i) + "\n")
	}
	return b.String()
}

// The attach's ssh client SIGKILLed mid-stream: reattach, output
// complete and not duplicated, the ledger detached then settled.
func TestSSHReattachAfterClientKilled(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	const n = 300
	k := c.start("reattach", longLease, lineJob(n)...)
	runtest.Eventually(t, "some output", func() bool { return strings.Contains(k.stdout(), "out 20\n") })
	var pid int
	runtest.Eventually(t, "the attach client", func() bool { pid = k.attachClient(); return pid > 0 })
	syscall.Kill(pid, syscall.SIGKILL)
	if code := k.wait(t); code != 0 {
		t.Fatalf("exit %d\nstderr: %s", code, tail(k.stderr()))
	}
	if got := k.stdout(); got != lineWant("out", n) {
		t.Errorf("stdout not complete and once: %d bytes, want %d\n%s", len(got), len(lineWant("out", n)), tail(got))
	}
	errs := k.stderr()
	// The controller's own words (the detach) are lines of their own.
	var jobErr strings.Builder
	for _, l := range strings.SplitAfter(errs, "\n") {
		if !strings.HasPrefix(l, "agent-wrap: ") {
			jobErr.WriteString(l)
		}
	}
	if jobErr.String() != lineWant("err", n) {
		t.Errorf("stderr not complete and once:\n%s", tail(errs))
	}
	ev := c.ctlEvents("reattach")
	di, si := indexOf(ev, "detached"), indexOf(ev, "settled")
	if di < 0 || si < di || !contains(ev, "attached") {
		t.Errorf("events: %v; want detached, attached, then settled", ev)
	}
	c.wantSettled("reattach", "completed", "", 0)
	c.treeGone("reattach")
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// waitFileJob prints "before", waits for FILE, prints "after", exits 5.
func waitFileJob(file string) []string {
	return []string{"sh", "-c", `echo before; while [ ! -e "$1" ]; do sleep 0.1; done; echo after; exit 5`, "sh", file}
}

// A blackhole shorter than the lease: the job lives on, renewals resume,
// output complete.
func TestSSHBlackholeShorterThanLease(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	gate := filepath.Join(t.TempDir(), "go")
	k := c.start("hole", []string{"--lease", "120s", "--grace", "2s", "--renew-every", "2s"}, waitFileJob(gate)...)
	runtest.Eventually(t, "before", func() bool { return strings.Contains(k.stdout(), "before\n") })
	c.waitEvent("hole", "renewed", 0)
	c.rl.Blackhole(true)
	c.waitEvent("hole", "renew_failed", 0)
	c.waitEvent("hole", "detached", 0)
	mark := len(c.ctlEvents("hole"))
	c.rl.Blackhole(false)
	c.waitEvent("hole", "renewed", mark)
	r, _ := c.status("hole")
	if r.State != "running" {
		t.Errorf("after the blackhole the run is %v, want running", r)
	}
	os.WriteFile(gate, nil, 0o600)
	if code := k.wait(t); code != 5 {
		t.Errorf("exit %d, want 5\nstderr: %s", code, k.stderr())
	}
	if got := k.stdout(); got != "before\nafter\n" {
		t.Errorf("stdout %q", got)
	}
	c.wantSettled("hole", "completed", "", 5)
	c.treeGone("hole")
}

// A blackhole past the lease and --give-up: the job died at its lease,
// the controller exits 255 naming settle, and settle after the heal
// records cancelled, cause lease, exit 124.
func TestSSHBlackholePastLease(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	// A long lease, so that no renewal races the clock on a loaded machine;
	// once the blackhole has cost the controller a renewal, the lease is
	// ended on demand on the host (renew --lease 1s, over a connection that
	// does not go through the relay): the lease passes during the blackhole.
	k := c.start("giveup", []string{"--lease", "120s", "--grace", "1s", "--renew-every", "1s", "--give-up", "8s"}, sleepTree...)
	runtest.Eventually(t, "started", func() bool { return strings.Contains(k.stdout(), "started\n") })
	c.waitEvent("giveup", "renewed", 0)
	c.rl.Blackhole(true)
	c.waitEvent("giveup", "renew_failed", len(c.ctlEvents("giveup")))
	c.endLease("giveup")
	if code := k.wait(t); code != 255 {
		t.Errorf("exit %d, want 255", code)
	}
	if !strings.Contains(k.stderr(), "agent-wrap settle giveup") {
		t.Errorf("stderr does not name settle: %s", k.stderr())
	}
	wantFinal(t, c.waitTerminal("giveup"), "cancelled", "lease", 124)
	c.treeGone("giveup")
	if r := c.ledgerRec("giveup"); r.State == ledger.Settled {
		t.Errorf("ledger settled before anyone learned the outcome: %+v", r)
	}
	c.rl.Blackhole(false)
	if code, out := c.settle("giveup"); code != 0 {
		t.Errorf("settle: exit %d: %s", code, out)
	}
	c.wantSettled("giveup", "cancelled", "lease", 124)
}

// The controller SIGKILLed right after the launch: the job dies at its
// lease; the ledger already held the run; settle records it.
func TestSSHControllerKilled(t *testing.T) {
	eachLedger(t, testSSHControllerKilled)
}

func testSSHControllerKilled(t *testing.T, c *ctlHarness) {
	k := c.start("killed", []string{"--lease", "120s", "--grace", "1s"}, sleepTree...)
	c.waitRunning("killed")
	k.signal(t, syscall.SIGKILL)
	k.wait(t)
	if r := c.ledgerRec("killed"); r.State == ledger.Settled || r.RunID != "killed" {
		t.Errorf("ledger after the kill: %+v", r)
	}
	// The killed controller could not remove its ssh log directory; it is
	// beside the records of a files ledger (not in /tmp), in the local
	// state directory with a database, for settle to remove.
	if left, _ := filepath.Glob(filepath.Join(c.sshLogDir(), ".ssh-killed-*")); len(left) != 1 {
		t.Errorf("ssh log directories of the killed controller in %s: %v, want one", c.sshLogDir(), left)
	}
	// Nobody renews any more; the lease is ended on demand rather than
	// raced (a 3 s lease could pass before the run was seen running on a
	// loaded machine).
	c.endLease("killed")
	wantFinal(t, c.waitTerminal("killed"), "cancelled", "lease", 124)
	c.treeGone("killed")
	if code, out := c.settle("--all"); code != 0 {
		t.Errorf("settle --all: exit %d: %s", code, out)
	}
	c.wantSettled("killed", "cancelled", "lease", 124)
	if left, _ := filepath.Glob(filepath.Join(c.sshLogDir(), ".ssh-*")); len(left) != 0 {
		t.Errorf("ssh log directories left after settle: %v", left)
	}
}

// Two controllers on one account; SIGINT to one; the other completes
// untouched (the fifth failure path of ssh_failure_test.go).
func TestSSHTwoControllersOneCancelled(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	gate := filepath.Join(t.TempDir(), "go")
	a := c.start("two-a", longLease, sleepTree...)
	b := c.start("two-b", longLease, append(waitFileJob(gate)[:2], `sleep 300 & echo before; while [ ! -e "$1" ]; do sleep 0.1; done; kill $!; echo after; exit 5`, "sh", gate)...)
	runtest.Eventually(t, "a started", func() bool { return strings.Contains(a.stdout(), "started\n") })
	runtest.Eventually(t, "b started", func() bool { return strings.Contains(b.stdout(), "before\n") })
	rb := c.waitRunning("two-b")
	bMembers := waitMembers(t, rb.PGID, 2)
	a.signal(t, syscall.SIGINT)
	if code := a.wait(t); code != 143 {
		t.Errorf("a: exit %d, want 143", code)
	}
	c.treeGone("two-a")
	for _, m := range bMembers {
		if !proc.Alive(m.PID, m.Start) {
			t.Errorf("b's member %d died with a's cancel", m.PID)
		}
	}
	os.WriteFile(gate, nil, 0o600)
	if code := b.wait(t); code != 5 {
		t.Errorf("b: exit %d, want 5: %s", code, b.stderr())
	}
	c.wantSettled("two-a", "cancelled", "cancel", 143)
	c.wantSettled("two-b", "completed", "", 5)
	c.treeGone("two-b")
}

// The host unreachable at launch: exit 255. No attempt got as far as
// the login (the relay passes nothing), so the controller knows the
// command was never sent and settles the run not_started itself: settle,
// once the host is back, has nothing to learn, and the host never had it.
func TestSSHUnreachableAtLaunch(t *testing.T) {
	eachLedger(t, testSSHUnreachableAtLaunch)
}

func testSSHUnreachableAtLaunch(t *testing.T, c *ctlHarness) {
	c.rl.Blackhole(true)
	k := c.start("nohost", []string{"--lease", "120s", "--give-up", "3s"}, "true")
	if code := k.wait(t); code != 255 {
		t.Errorf("exit %d, want 255", code)
	}
	if !strings.Contains(k.stderr(), "run nohost: not started: ") || !strings.Contains(k.stderr(), "the command was never sent") {
		t.Errorf("stderr does not say the run was not started: %s", k.stderr())
	}
	if r := c.ledgerRec("nohost"); r.State != ledger.Settled {
		t.Errorf("ledger state %s, want settled", r.State)
	}
	c.rl.Blackhole(false)
	code, out := c.settle("nohost")
	if code != 0 || !strings.Contains(out, "nohost: not_started") || !strings.Contains(out, "settled already") {
		t.Errorf("settle: exit %d: %s", code, out)
	}
	if r := c.ledgerRec("nohost"); r.Outcome != ledger.NotStarted {
		t.Errorf("ledger outcome %q, want not_started", r.Outcome)
	}
	if _, err := c.status("nohost"); err == nil {
		t.Errorf("the host has a run nohost: it was started")
	}
}

// Bad input: a host without agent-wrap (says so, naming --remote-bin and
// deploy); a run ID already in the ledger (refused, the record untouched).
func TestSSHNoAgentWrapAndDuplicateID(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	args := []string{"ssh", "--rsh", c.rsh(), "--remote-bin", "/no/agent-wrap", "--ledger", c.ledger, "--id", "nobin", c.srv.Destination(), "--", "true"}
	out, err := execBin(args...)
	if code := exitCode(err); code != 127 || !strings.Contains(out, "--remote-bin") || !strings.Contains(out, "agent-wrap deploy") {
		t.Errorf("no agent-wrap: exit %d: %s", code, out)
	}
	if r := c.ledgerRec("nobin"); r.Outcome != ledger.NotStarted {
		t.Errorf("ledger: %+v", r)
	}
	before, _ := os.ReadFile(filepath.Join(c.ledger, "nobin.json"))
	out, err = execBin(args...)
	if code := exitCode(err); code != 64 || !strings.Contains(out, "already in the ledger") {
		t.Errorf("duplicate ID: exit %d: %s", code, out)
	}
	after, _ := os.ReadFile(filepath.Join(c.ledger, "nobin.json"))
	if !bytes.Equal(before, after) {
		t.Errorf("the duplicate changed the ledger record")
	}
}

// A cancel before the launch ever reached the host: the launch is never
// sent again; once the host can be asked, the run is not_started and the
// controller exits 143. (ssh gives up on the blackholed connection after
// its ConnectTimeout, 2 s here; the relay is healed only after that, so the
// held bytes of that connection cannot start the run late.)
func TestSSHCancelBeforeLaunch(t *testing.T) {
	eachLedger(t, testSSHCancelBeforeLaunch)
}

func testSSHCancelBeforeLaunch(t *testing.T, c *ctlHarness) {
	c.rl.Blackhole(true)
	k := c.start("early", []string{"--rsh", c.rsh("-o", "ConnectTimeout=2"), "--lease", "120s", "--give-up", "60s"}, "true")
	c.waitEvent("early", "detached", 0)
	k.signal(t, syscall.SIGINT)
	runtest.Eventually(t, "ledger cancel_requested", func() bool { return c.ledgerRec("early").CancelRequested })
	c.rl.Blackhole(false)
	if code := k.wait(t); code != 143 {
		t.Errorf("exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	if r := c.ledgerRec("early"); r.State != ledger.Settled || r.Outcome != ledger.NotStarted {
		t.Errorf("ledger: state %s outcome %s, want settled not_started", r.State, r.Outcome)
	}
	if _, err := os.Stat(filepath.Join(c.root, "early")); err == nil {
		t.Errorf("the host has run early: it was started after the cancel")
	}
}

// A controller SIGKILLed at any of the moments of a run leaves a ledger
// that settle finishes: once the host has the run (claimed, seen running,
// output delivered), settle records the run's own outcome. Its ssh clients
// die with it.
func TestSSHKilledAtEachMoment(t *testing.T) {
	eachLedger(t, testSSHKilledAtEachMoment)
}

func testSSHKilledAtEachMoment(t *testing.T, c *ctlHarness) {
	// Long enough after its output that a loaded machine still finds the
	// controller alive at each moment.
	job := []string{"sh", "-c", "echo x; sleep 4; exit 4"}
	for _, m := range []struct {
		id   string
		when func(id string, k *ctl) bool
	}{
		{"kill-claimed", func(id string, k *ctl) bool { _, err := os.Stat(filepath.Join(c.root, id)); return err == nil }},
		{"kill-running", func(id string, k *ctl) bool { return c.ledgerState(id) == ledger.Running }},
		{"kill-output", func(id string, k *ctl) bool { return k.stdout() == "x\n" }},
	} {
		k := c.start(m.id, longLease, job...)
		runtest.Eventually(t, m.id+": the moment", func() bool { return m.when(m.id, k) })
		var clients []int
		for _, p := range childrenOf(k.cmd.Process.Pid) {
			clients = append(clients, p.PID)
		}
		k.signal(t, syscall.SIGKILL)
		k.wait(t)
		if r := c.ledgerRec(m.id); r.State == ledger.Settled {
			t.Errorf("%s: settled by a controller that was killed: %+v", m.id, r)
		}
		for _, pid := range clients {
			runtest.Eventually(t, "the killed controller's ssh client to die", func() bool { return !proc.Alive(pid, 0) })
		}
		c.waitTerminal(m.id)
		if code, out := c.settle(m.id); code != 0 {
			t.Errorf("%s: settle exit %d: %s", m.id, code, out)
		}
		c.wantSettled(m.id, "completed", "", 4)
		c.treeGone(m.id)
	}
}

// A host whose agent-wrap predates attach: the launch starts the run, the
// attach is a usage error (64) found before any claim, and the controller
// says so, naming deploy, and follows the run to its code with wait.
func TestSSHHostWithoutAttach(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	old := hostScript(t, t.TempDir(), "for a; do [ \"$a\" = attach ] && { echo 'agent-wrap: run: unknown flag: --from' >&2; exit 64; }; done\n")
	// A job that ends at once, and one that is still running when the
	// attach is refused (it ends when the test says).
	gate := filepath.Join(t.TempDir(), "go")
	for _, tc := range []struct {
		id  string
		job []string
	}{
		{"oldhost-quick", []string{"sh", "-c", "echo out; exit 6"}},
		{"oldhost-live", []string{"sh", "-c", `echo out; while [ ! -e "$1" ]; do sleep 0.1; done; exit 6`, "sh", gate}},
	} {
		k := c.start(tc.id, []string{"--remote-bin", old, "--lease", "120s"}, tc.job...)
		if tc.id == "oldhost-live" {
			runtest.Eventually(t, "the refusal said", func() bool { return strings.Contains(k.stderr(), "no attach command") })
			c.waitRunning(tc.id)
			os.WriteFile(gate, nil, 0o600)
		}
		if code := k.wait(t); code != 6 {
			t.Errorf("%s: exit %d, want 6\nstderr: %s", tc.id, code, k.stderr())
		}
		if !strings.Contains(k.stderr(), "no attach command") || !strings.Contains(k.stderr(), "agent-wrap deploy") {
			t.Errorf("%s: stderr does not say why the output is missing: %s", tc.id, k.stderr())
		}
		c.wantSettled(tc.id, "completed", "", 6)
	}
	if _, err := os.Stat(filepath.Join(c.root, "attach")); err == nil {
		t.Errorf("the old host ran a job under the run ID \"attach\"")
	}
}

// A host whose agent-wrap predates cancel --json (64, unknown flag): the
// controller says so and cancels with the plain cancel, whose exit 0 is the
// confirmation; the run's final record is learned as after any cancel.
func TestSSHHostWithoutCancelJSON(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	old := hostScript(t, t.TempDir(), "case \" $* \" in *' cancel --json '*) echo 'agent-wrap: cancel: unknown flag: --json' >&2; exit 64;; esac\n")
	k := c.start("oldcancel", []string{"--remote-bin", old, "--lease", "120s"}, sleepTree...)
	runtest.Eventually(t, "the job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	c.waitRunning("oldcancel")
	k.signal(t, syscall.SIGINT)
	if code := k.wait(t); code != 143 {
		t.Errorf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	if !strings.Contains(k.stderr(), "has no cancel --json") {
		t.Errorf("the controller did not say why it fell back: %s", k.stderr())
	}
	wantFinal(t, c.waitTerminal("oldcancel"), "cancelled", "cancel", 143)
	c.treeGone("oldcancel")
	c.wantSettled("oldcancel", "cancelled", "cancel", 143)
}
