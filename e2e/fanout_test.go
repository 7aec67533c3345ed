package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The controller's fan-out (--mux auto, the default): many controller
// processes to one host share a handful of agent-wrap-owned ControlMasters,
// against an sshd with OpenSSH's default limits (MaxSessions 10,
// MaxStartups 10:30:100), and their renewals go to the host in batches.

// masterSeen is a ControlMaster as its recorded PID file names it.
type masterSeen struct {
	pid   int
	start uint64
}

// watchMasters records, until stop is closed, every master PID the
// controllers recorded in dir (HASH.N.pid), checked against /proc: it must
// be a live ssh whose command line names its socket in dir.
func watchMasters(t *testing.T, dir string, stop <-chan struct{}) (seen func() map[masterSeen]bool) {
	var mu sync.Mutex
	all := map[masterSeen]bool{}
	look := func() {
		for _, m := range controller.RecordedMasters(dir) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", m.PID))
			if len(cmd) == 0 {
				// Exiting between the two reads: a process that has
				// released its memory (a zombie) has no command line.
				continue
			}
			if !strings.Contains(string(cmd), "ControlPath="+m.Socket) {
				t.Errorf("recorded master %d is not the master of %s: %q", m.PID, m.Socket, cmd)
				continue
			}
			mu.Lock()
			all[masterSeen{m.PID, m.Start}] = true
			mu.Unlock()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			look()
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() map[masterSeen]bool {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return all
	}
}

// processesUnder lists the live processes whose command line names dir.
func processesUnder(dir string) []string {
	self := os.Getpid()
	live, _ := proc.ScanInto(nil, func(st proc.Stat) bool { return st.PID != self && !st.Dead() })
	var out []string
	for _, st := range live {
		pid := strconv.Itoa(st.PID)
		b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		if strings.Contains(string(b), dir+"/") {
			out = append(out, pid+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// countingRemoteBin writes a script that logs each remote agent-wrap
// invocation ("UNIXTIME ARGS...") to log, then runs bin: the host's own
// count of the sessions that ran a command.
func countingRemoteBin(t *testing.T, log string) string {
	p := filepath.Join(t.TempDir(), "agent-wrap-counted")
	script := "#!/bin/sh\necho \"$(date +%s) $*\" >> " + sshtest.Quote(log) + "\nexec " + sshtest.Quote(bin) + " \"$@\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFanoutThroughMux: 50 concurrent controllers, all of whose jobs are
// running at once (a barrier), complete and are settled with their own
// exit codes; sshd refuses nothing; the host sees at most 50/8+4 ssh
// connections at once (counted by the relay every connection goes
// through); more than one master was needed (a full one was answered by
// another); the leases (20 s, renewed every 2 s, jobs that outlive them)
// were kept alive by renewals batched over few sessions; and no master is
// left once the controllers have ended.
func TestFanoutThroughMux(t *testing.T) {
	t.Parallel()
	const runs = 50
	c := newCtlHarness(t, sshtest.DefaultLimits)
	dir := muxDirFor(t)
	barrier := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls.log")
	remoteBin := countingRemoteBin(t, calls)

	stop := make(chan struct{})
	seen := watchMasters(t, dir, stop)
	ctls := make([]*ctl, runs)
	for i := range ctls {
		id := fmt.Sprintf("fan-%02d", i)
		// Every job waits until all have started (counting the barrier by a
		// glob, so 50 waiting jobs fork one sleep each half second, not a
		// pipeline five times a second), so that all 50 attach
		// sessions are open at once, then outlives its lease by far.
		job := fmt.Sprintf("touch %s/%s; while set -- %s/*; [ $# -lt %d ]; do sleep 0.5; done; echo all-%d; sleep 22; exit %d",
			barrier, id, barrier, runs, i, i%3)
		args := []string{"ssh", "--rsh", c.rsh(), "--remote-bin", remoteBin, "--remote-root", c.root,
			"--ledger", c.ledger, "--events", c.events, "--id", id,
			"--lease", "20s", "--renew-every", "2s", c.srv.Destination(), "--", "sh", "-c", job}
		ctls[i] = startCtl(t, args)
	}
	c.wantFannedOut(t, "fan", ctls)
	close(stop)
	masters := seen()

	_, peak, total := c.rl.Connections()
	t.Logf("connections through the relay: at most %d at once, %d in all; masters seen: %d", peak, total, len(masters))
	if limit := runs/8 + 4; peak > limit {
		t.Errorf("the host saw %d ssh connections at once, want at most %d", peak, limit)
	}
	if len(masters) < 2 {
		t.Errorf("%d masters for %d sessions at once against MaxSessions 10: a full master was not answered by another", len(masters), runs)
	}
	log := c.srv.Log()
	for _, bad := range []string{"MaxStartups", "drop connection"} {
		if strings.Contains(log, bad) {
			t.Errorf("sshd said %q:\n%s", bad, log)
		}
	}

	// The host's count of renew sessions, and what they renewed.
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	sessions, renewed, single := 0, 0, 0
	perSecond := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[3] != "renew" {
			continue
		}
		sessions++
		if f[4] != "--json" {
			single++
			continue
		}
		renewed += len(f) - 5
		perSecond[f[0]]++
	}
	busiest := 0
	for _, n := range perSecond {
		busiest = max(busiest, n)
	}
	t.Logf("renew sessions on the host: %d (%d single), %d run renewals, busiest second %d sessions", sessions, single, renewed, busiest)
	if single > 0 {
		t.Errorf("%d renewals went alone, not batched", single)
	}
	if sessions == 0 || renewed < 4*sessions {
		t.Errorf("%d renew sessions renewed %d runs: not batched", sessions, renewed)
	}

	// No master outlives the controllers.
	for m := range masters {
		runtest.Eventually(t, fmt.Sprintf("master %d gone", m.pid), func() bool { return !proc.Alive(m.pid, m.start) })
	}
	if left := processesUnder(dir); len(left) > 0 {
		t.Errorf("left running after the controllers ended:\n%s", strings.Join(left, "\n"))
	}
}

// TestMuxMasterKilledReattach: the masters carrying three runs' attach
// sessions are SIGKILLed (by their recorded PIDs); every run reattaches
// at once over a new master and completes with all of its output.
func TestMuxMasterKilledReattach(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t, sshtest.DefaultLimits)
	dir := muxDirFor(t)
	gate := filepath.Join(t.TempDir(), "go")
	var ctls []*ctl
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("mk-%d", i)
		job := fmt.Sprintf("echo before-%d; while [ ! -e %s ]; do sleep 0.1; done; echo after-%d", i, gate, i)
		ctls = append(ctls, c.start(id, nil, "sh", "-c", job))
	}
	for i, k := range ctls {
		runtest.Eventually(t, "run attached", func() bool { return strings.Contains(k.stdout(), fmt.Sprintf("before-%d\n", i)) })
	}
	stop := make(chan struct{})
	seen := watchMasters(t, dir, stop)
	time.Sleep(100 * time.Millisecond) // one look at the pid files
	close(stop)
	old := seen()
	if len(old) == 0 {
		t.Fatal("no master recorded")
	}
	for m := range old {
		if proc.Alive(m.pid, m.start) {
			_ = syscall.Kill(m.pid, syscall.SIGKILL)
		}
	}
	for i := range ctls {
		c.waitEvent(fmt.Sprintf("mk-%d", i), "detached", 0)
	}
	for i := range ctls {
		c.waitEvent(fmt.Sprintf("mk-%d", i), "attached", 0)
	}
	stop2 := make(chan struct{})
	seen2 := watchMasters(t, dir, stop2)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, k := range ctls {
		id := fmt.Sprintf("mk-%d", i)
		if code := k.wait(t); code != 0 {
			t.Errorf("run %s: exit %d\nstderr: %s", id, code, k.stderr())
		}
		if want := fmt.Sprintf("before-%d\nafter-%d\n", i, i); k.stdout() != want {
			t.Errorf("run %s: stdout %q, want %q", id, k.stdout(), want)
		}
		c.wantSettled(id, ledger.Completed, "", 0)
	}
	close(stop2)
	for m := range seen2() {
		if old[m] {
			t.Errorf("master %d was killed but is seen again", m.pid)
		}
		runtest.Eventually(t, fmt.Sprintf("master %d gone", m.pid), func() bool { return !proc.Alive(m.pid, m.start) })
	}
	if left := processesUnder(dir); len(left) > 0 {
		t.Errorf("left running after the controllers ended:\n%s", strings.Join(left, "\n"))
	}
}

// TestMuxBadInput: a ControlMaster socket directory open to others is
// refused (78, a hint, nothing in the ledger, nothing on the host), and
// --mux takes auto or off only (64).
func TestMuxBadInput(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	open := filepath.Join(muxDirFor(t), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(env string, flags ...string) (int, string) {
		args := []string{"ssh", "--rsh", c.rsh(), "--remote-bin", bin, "--remote-root", c.root,
			"--ledger", c.ledger, "--id", "bad"}
		args = append(append(args, flags...), c.srv.Destination(), "--", "true")
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "AGENT_WRAP_MUX_DIR="+env)
		out, err := cmd.CombinedOutput()
		return exitCode(err), string(out)
	}
	code, out := run(open)
	if code != 78 || !strings.Contains(out, "mode 0755") || !strings.Contains(out, "hint:") || !strings.Contains(out, "--mux off") {
		t.Errorf("an open socket directory: exit %d, want 78 with the mode and a hint:\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(c.ledger, "bad.json")); !os.IsNotExist(err) {
		t.Errorf("the ledger has a record after the refusal (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(c.root, "bad")); !os.IsNotExist(err) {
		t.Errorf("the host has the run after the refusal (%v)", err)
	}
	code, out = run(muxDirFor(t), "--mux", "sometimes")
	if code != 64 || !strings.Contains(out, `--mux "sometimes"`) || !strings.Contains(out, "hint:") {
		t.Errorf("--mux sometimes: exit %d, want 64 naming it:\n%s", code, out)
	}
	// --mux off with the same open directory: no mux, the run goes.
	code, out = run(open, "--mux", "off")
	if code != 0 {
		t.Errorf("--mux off: exit %d, want 0:\n%s", code, out)
	}
	c.wantSettled("bad", ledger.Completed, "", 0)
}

// TestMuxLaunchKilledInMasterRunsNothing: a launch whose session request
// waits in a ControlMaster (its connection held by the relay) when TERM
// comes: the controller kills its client, learns over a new master that
// the run was never claimed (143, not_started); when the held connection
// flows again and the master opens the session at last, the session runs
// nothing (the launch gate: it waited for a "go" that never came), so no
// run starts behind the ledger's back.
func TestMuxLaunchKilledInMasterRunsNothing(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	// A run that keeps a master up.
	keep := c.start("keeper", []string{"--lease", "60s"}, "sh", "-c", "echo up; sleep 60")
	runtest.Eventually(t, "the keeper's output", func() bool { return strings.Contains(keep.stdout(), "up\n") })
	c.rl.Hold()
	started := strings.Count(c.srv.Log(), "Starting session:")
	k := c.start("gated", []string{"--lease", "60s"}, "true")
	runtest.Eventually(t, "the gated launch's client", func() bool { return len(childrenOf(k.cmd.Process.Pid)) > 0 })
	time.Sleep(200 * time.Millisecond) // its request reaches the master: the moment of the scenario
	k.signal(t, syscall.SIGTERM)
	if code := k.wait(t); code != 143 {
		t.Errorf("TERM during a held launch: exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	c.wantNotStarted("gated", "cancelled before the launch")
	closed := strings.Count(c.srv.Log(), "Close session:")
	c.rl.Release()
	// The held session opens now, and ends.
	runtest.Eventually(t, "the held session opened and closed", func() bool {
		log := c.srv.Log()
		return strings.Count(log, "Starting session:") > started && strings.Count(log, "Close session:") > closed
	})
	if _, err := os.Stat(filepath.Join(c.root, "gated")); !os.IsNotExist(err) {
		t.Errorf("the run started on the host after the controller called it not_started (%v)", err)
	}
	keep.signal(t, syscall.SIGTERM)
	keep.wait(t)
}

// waitWithin is ctl.wait with a deadline of d instead of a minute: the
// first controller of a burst waits for the whole burst's launches.
func (k *ctl) waitWithin(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-k.group.Done():
	case <-time.After(d):
	}
	return k.wait(t)
}

// TestFanoutMastersFill: 20 concurrent controllers against an sshd that
// allows 4 sessions a connection (MaxSessions 4, MaxStartups at its
// default): the masters fill and new ones open, the host's limit is learned
// from its first refusal (a master's cap, HASH.N.cap, of at most 4) rather
// than met by every call, and with every master full of launches and
// attaches the runs' renewals still find the session kept for them (the
// jobs outlive their 8 s leases by far, so a renewal starved is a run
// ended by its lease). Every run settles completed with its own code, no
// controller lost a connection, and nothing is left: no process of any
// run on the host, no master, no client, once the controllers have ended.
func TestFanoutMastersFill(t *testing.T) {
	t.Parallel()
	const runs = 20
	c := newCtlHarness(t, sshtest.MaxSessions(4))
	dir := muxDirFor(t)
	barrier := t.TempDir()

	stop := make(chan struct{})
	seen := watchMasters(t, dir, stop)
	var capMu sync.Mutex
	caps := map[string]string{}
	capsDone := make(chan struct{})
	go func() {
		defer close(capsDone)
		for {
			names, _ := filepath.Glob(filepath.Join(dir, "*.cap"))
			for _, n := range names {
				if b, err := os.ReadFile(n); err == nil {
					capMu.Lock()
					caps[n] = strings.TrimSpace(string(b))
					capMu.Unlock()
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	ctls := make([]*ctl, runs)
	for i := range ctls {
		id := fmt.Sprintf("fill-%02d", i)
		job := fmt.Sprintf("touch %s/%s; while set -- %s/*; [ $# -lt %d ]; do sleep 0.5; done; echo all-%d; sleep 20; exit %d",
			barrier, id, barrier, runs, i, i%3)
		ctls[i] = c.start(id, []string{"--lease", "16s", "--renew-every", "2s"}, "sh", "-c", job)
	}
	c.wantFannedOut(t, "fill", ctls)
	close(stop)
	masters := seen()
	<-capsDone

	_, peak, total := c.rl.Connections()
	t.Logf("connections through the relay: at most %d at once, %d in all; masters seen: %d; caps learned: %v", peak, total, len(masters), caps)
	// 4 sessions a connection: 20 sessions at once need 5 masters at
	// least (7 once each master's cap is learned and its 4th session is
	// kept for short calls; a session that took it before is not moved).
	if len(masters) < runs/4 {
		t.Errorf("%d masters for %d long sessions at once against MaxSessions 4: full masters were not answered by new ones", len(masters), runs)
	}
	if peak > 12 {
		t.Errorf("the host saw %d ssh connections at once, want at most 12", peak)
	}
	learned := false
	for _, v := range caps {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4 {
			t.Errorf("a master's learned cap is %q, want 1 to 4 (the host's MaxSessions)", v)
		}
		learned = learned || err == nil
	}
	if !learned {
		t.Error("no master learned the host's MaxSessions from a refusal")
	}
	for _, bad := range []string{"MaxStartups", "drop connection"} {
		if strings.Contains(c.srv.Log(), bad) {
			t.Errorf("sshd said %q", bad)
		}
	}

	// Nothing left: no process of any run, no master, no client.
	for i := 0; i < runs; i++ {
		rec, err := c.status(fmt.Sprintf("fill-%02d", i))
		if err != nil || !rec.terminal() {
			t.Errorf("run fill-%02d on the host: %+v (%v), want a terminal record", i, rec, err)
			continue
		}
		waitGroupEmpty(t, rec.PGID)
	}
	for m := range masters {
		runtest.Eventually(t, fmt.Sprintf("master %d gone", m.pid), func() bool { return !proc.Alive(m.pid, m.start) })
	}
	if left := processesUnder(dir); len(left) > 0 {
		t.Errorf("left running after the controllers ended:\n%s", strings.Join(left, "\n"))
	}
}

// wantFannedOut waits for each controller of a fan-out (run PREFIX-NN, the
// job printing all-N and exiting N%3) and fails for a wrong exit, a missing
// line, a connection the controller lost, or a record not settled
// completed; the controller's events are logged when anything failed.
func (c *ctlHarness) wantFannedOut(t *testing.T, prefix string, ctls []*ctl) {
	t.Helper()
	for i, k := range ctls {
		id := fmt.Sprintf("%s-%02d", prefix, i)
		if code := k.waitWithin(t, 4*time.Minute); code != i%3 {
			t.Errorf("run %s: exit %d, want %d\nstderr: %s", id, code, i%3, k.stderr())
		}
		if !strings.Contains(k.stdout(), fmt.Sprintf("all-%d\n", i)) {
			t.Errorf("run %s: stdout %q lacks its line", id, k.stdout())
		}
		if strings.Contains(k.stderr(), "lost") {
			t.Errorf("run %s: the controller lost a connection:\n%s", id, k.stderr())
		}
		c.wantSettled(id, ledger.Completed, "", i%3)
	}
	if t.Failed() {
		b, _ := os.ReadFile(c.events)
		t.Logf("events:\n%s", b)
	}
}
