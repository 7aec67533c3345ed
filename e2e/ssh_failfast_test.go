package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// A controller that stops when asked and fails fast when it cannot start.
// The bounds on elapsed time below are the feature (a runner that sends
// TERM waits a few seconds, then SIGKILLs), and generous: every one of
// these ends in well under a second when the machine is idle.

// closedPort returns a port on 127.0.0.1 that refuses connections for the
// whole test: a socket bound to it but not listening (so no other test
// can take it meanwhile).
func closedPort(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*unix.SockaddrInet4).Port
}

// sshArgsWith returns the test server's ssh options with the value of
// flag (such as "-p" or "-i") replaced.
func (c *ctlHarness) sshArgsWith(flag, value string) []string {
	args := c.srv.SSHArgs()
	for i := range args[:len(args)-1] {
		if args[i] == flag {
			args[i+1] = value
		}
	}
	return args
}

// wantNotStarted checks the ledger says settled, not_started, with a
// reason containing why, and that the host has no run of the ID.
func (c *ctlHarness) wantNotStarted(id, why string) {
	c.t.Helper()
	r := c.ledgerRec(id)
	if r.State != ledger.Settled || r.Outcome != ledger.NotStarted || !strings.Contains(r.Reason, why) {
		c.t.Errorf("ledger %s: state %s outcome %s reason %q; want settled not_started, reason with %q", id, r.State, r.Outcome, r.Reason, why)
	}
	if _, err := os.Stat(filepath.Join(c.root, id)); !os.IsNotExist(err) {
		c.t.Errorf("the host has a run directory for %s (%v): it was started", id, err)
	}
}

// waitExit waits for the controller and returns its code and how long it
// took from since.
func (k *ctl) waitExit(t *testing.T, since time.Time) (int, time.Duration) {
	t.Helper()
	code := k.wait(t)
	return code, time.Since(since)
}

// termWithin SIGTERMs the controller and fails unless it exits with want
// within bound; it returns when the TERM was sent.
func (k *ctl) termWithin(t *testing.T, want int, bound time.Duration) time.Time {
	t.Helper()
	sent := time.Now()
	k.signal(t, syscall.SIGTERM)
	code, took := k.waitExit(t, sent)
	t.Logf("TERM to exit: %v", took)
	if code != want {
		t.Errorf("exit %d, want %d\nstderr: %s", code, want, k.stderr())
	}
	if took > bound {
		t.Errorf("TERM to exit took %v, want within %v", took, bound)
	}
	return sent
}

// A closed port and TERM at 2 s (mid-backoff, with the default --give-up
// of minutes): the controller ends at once, 143, ledger not_started, and
// the host never saw the run.
func TestSSHTermWhileHostRefuses(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	rsh := sshtest.Quote(append([]string{"ssh"}, c.sshArgsWith("-p", strconv.Itoa(closedPort(t)))...)...)
	began := time.Now()
	k := c.start("refused", []string{"--rsh", rsh, "--lease", "120s"}, "true")
	c.waitEvent("refused", "detached", 0)
	time.Sleep(time.Until(began.Add(2 * time.Second))) // the moment of the scenario, not a wait on a condition
	sent := k.termWithin(t, 143, 3*time.Second)
	t.Logf("TERM at %v", sent.Sub(began).Round(time.Millisecond))
	c.wantNotStarted("refused", "cancelled before the launch")
	if r := c.ledgerRec("refused"); !r.CancelRequested {
		t.Errorf("ledger lost cancel_requested: %+v", r)
	}
	if !strings.Contains(k.stderr(), "Connection refused") {
		t.Errorf("stderr does not say why it could not connect: %s", k.stderr())
	}
}

// heldLaunch starts a run whose launch reaches the host and claims the
// run, while the relay holds that connection (hold is called once the
// command has reached the host and before the run's record can come back):
// the controller has not seen the run. The remote agent-wrap is a script
// that, for the launch only, waits for the test. Keepalives are slow, so
// only a cancel can end the held launch. It returns the controller and the
// PID of its held ssh client.
func (c *ctlHarness) heldLaunch(id string, hold func()) (*ctl, int) {
	c.t.Helper()
	dir := c.t.TempDir()
	sent, gate := filepath.Join(dir, "sent"), filepath.Join(dir, "go")
	script := hostScript(c.t, dir, "case \" $* \" in *\" run --detach \"*) : > "+sent+"; while [ ! -e "+gate+" ]; do sleep 0.05; done;; esac\n")
	rsh := c.rsh("-o", "ServerAliveInterval=60")
	k := c.start(id, []string{"--rsh", rsh, "--remote-bin", script, "--lease", "120s", "--grace", "2s"}, sleepTree...)
	runtest.Eventually(c.t, "the launch's command on the host", func() bool { _, err := os.Stat(sent); return err == nil })
	hold()
	var client int
	runtest.Eventually(c.t, "the launch's ssh client", func() bool {
		for _, p := range childrenOf(k.cmd.Process.Pid) {
			client = p.PID
		}
		return client > 0
	})
	os.WriteFile(gate, nil, 0o600)
	c.waitRunning(id)
	if r := c.ledgerRec(id); r.State != ledger.Launching {
		c.t.Fatalf("ledger %s before the cancel: %s, want launching (the record is held)", id, r.State)
	}
	return k, client
}

// A launch held after its command reached the host, then TERM: the
// controller kills the held client, asks the host over a new connection,
// finds the run, and cancels it as any launched run (confirmed, 143).
func TestSSHTermWhileLaunchHeld(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k, client := c.heldLaunch("held", c.rl.Hold)
	k.termWithin(t, 143, 10*time.Second)
	wantFinal(t, c.waitTerminal("held"), "cancelled", "cancel", 143)
	c.treeGone("held")
	c.wantSettled("held", "cancelled", "cancel", 143)
	if proc.Alive(client, 0) {
		t.Errorf("the held launch's ssh client %d is still alive", client)
	}
	if ev := c.ctlEvents("held"); !contains(ev, "cancel_confirmed") {
		t.Errorf("events lack cancel_confirmed: %v", ev)
	}
}

// The same with the host unreachable after the command was sent (every
// connection blackholed): the controller cannot learn whether the run
// started, says unknown (255) promptly, and leaves the run for settle,
// which learns the truth once the host is back.
func TestSSHTermWhileLaunchUnanswered(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k, client := c.heldLaunch("unanswered", func() { c.rl.Blackhole(true) })
	k.termWithin(t, 255, 10*time.Second)
	for _, want := range []string{"outcome unknown", "may have reached", "agent-wrap settle unanswered"} {
		if !strings.Contains(k.stderr(), want) {
			t.Errorf("stderr lacks %q: %s", want, k.stderr())
		}
	}
	if r := c.ledgerRec("unanswered"); r.State != ledger.Launching || !r.CancelRequested || !strings.Contains(r.Reason, "may have reached") {
		t.Errorf("ledger: state %s cancel_requested %v reason %q; want launching, true, why", r.State, r.CancelRequested, r.Reason)
	}
	if proc.Alive(client, 0) {
		t.Errorf("the launch's ssh client %d is still alive", client)
	}
	// The run did start; settle finds it once the host is back.
	c.rl.Blackhole(false)
	if code, out := c.settle("unanswered"); code != 3 {
		t.Errorf("settle while the run lives: exit %d, want 3: %s", code, out)
	}
	if r := c.ssh("cancel", "unanswered"); r.code != 0 {
		t.Fatalf("cancel on the host: %d %s", r.code, r.stderr)
	}
	if code, out := c.settle("unanswered"); code != 0 {
		t.Errorf("settle: exit %d: %s", code, out)
	}
	c.wantSettled("unanswered", "cancelled", "cancel", 143)
	c.treeGone("unanswered")
}

// Permanent first-connection errors end the controller within seconds,
// whatever --give-up is: not_started, 255, ssh's line and a hint.
func TestSSHPermanentConnectErrors(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	other := filepath.Join(t.TempDir(), "id_other")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "refused", "-f", other).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	proxy := []string{"-o", "ProxyCommand=" + c.rl.ProxyCommand()}
	for _, tc := range []struct {
		id, dest string
		rsh      []string
		line     string // ssh's, in the message and the ledger
	}{
		{"resolve", "nosuchhost.invalid", c.srv.SSHArgs(), "Could not resolve hostname nosuchhost.invalid"},
		{"badkey", c.srv.Destination(), append(c.sshArgsWith("-i", other), proxy...), "Permission denied (publickey)"},
		{"badopt", c.srv.Destination(), append([]string{"-o", "NoSuchOption=1"}, append(c.srv.SSHArgs(), proxy...)...), "Bad configuration option: nosuchoption"},
	} {
		rsh := sshtest.Quote(append([]string{"ssh"}, tc.rsh...)...)
		began := time.Now()
		k := c.startTo(tc.dest, tc.id, []string{"--rsh", rsh, "--lease", "120s"}, "true")
		code, took := k.waitExit(t, began)
		t.Logf("%s: start to exit: %v", tc.id, took)
		if code != 255 {
			t.Errorf("%s: exit %d, want 255\nstderr: %s", tc.id, code, k.stderr())
		}
		if took > 10*time.Second {
			t.Errorf("%s: took %v, want within 10 s", tc.id, took)
		}
		errs := k.stderr()
		if !strings.Contains(errs, "not started: ssh cannot connect to "+tc.dest+": ") || !strings.Contains(errs, tc.line) || !strings.Contains(errs, "agent-wrap: hint: check ") {
			t.Errorf("%s: stderr does not quote ssh's line %q with a hint: %s", tc.id, tc.line, errs)
		}
		c.wantNotStarted(tc.id, tc.line)
	}
}
