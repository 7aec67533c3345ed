package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/agenttest"
	"github.com/agent-wrap/agent-wrap/internal/relay"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/timeline"
)

// agent-wrap ssh --agent MODE, with a real ssh-agent on the
// controller's side and a real sshd that allows agent forwarding. scoped:
// the launch connection forwards the agent and the job lists its key
// through the run's relay (its SSH_AUTH_SOCK is the relay's, not sshd's),
// journaled and revoked with the run; inherit: sshd's socket as is; none:
// nothing forwarded, no agent in the job; no --agent: nothing added (the
// test's ssh configuration forwards nothing); a bad mode: 64 before the
// ledger is written.
func TestSSHAgentForwarded(t *testing.T) {
	t.Parallel()
	a := agenttest.Start(t)
	h := &harness{t: t, srv: sshtest.Start(t, sshtest.AllowAgentForwarding), root: t.TempDir()}
	t.Cleanup(h.killRuns)
	c := &ctlHarness{harness: h, rl: relay.Start(t, h.srv.Host()+":"+strconv.Itoa(h.srv.Port())),
		ledger: filepath.Join(t.TempDir(), "ledger")}
	// OpenSSH forwards no agent while IdentityAgent is none (the test
	// server's default, so that no login uses an agent): name the agent;
	// logins still use the server's key alone (IdentitiesOnly).
	rsh := strings.Replace(c.rsh(), "IdentityAgent=none", "IdentityAgent="+a.Sock, 1)
	if rsh == c.rsh() {
		t.Fatalf("no IdentityAgent=none in the rsh %s", rsh)
	}
	job := []string{"sh", "-c", `echo "sock=$SSH_AUTH_SOCK"; ssh-add -l; echo "rc=$?"`}
	ctl := func(id string, flags ...string) (int, string) {
		t.Helper()
		args := []string{"ssh", "--rsh", rsh, "--remote-bin", bin, "--remote-root", c.root, "--ledger", c.ledger, "--id", id}
		args = append(append(append(args, flags...), c.srv.Destination(), "--"), job...)
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+a.Sock)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		t.Logf("%s: exit %d\nstdout: %s\nstderr: %s", id, exitCode(err), out.String(), errb.String())
		return exitCode(err), out.String()
	}
	events := func(id string) map[string]timeline.Item {
		t.Helper()
		out, err := exec.Command(bin, "--root", c.root, "show", "--json", id).Output()
		if err != nil {
			t.Fatalf("show %s: %v", id, err)
		}
		var s timeline.Show
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatalf("show --json %s: %v", id, err)
		}
		m := map[string]timeline.Item{}
		for _, it := range s.Events {
			if _, ok := m[it.Event]; !ok {
				m[it.Event] = it
			}
		}
		return m
	}

	code, out := ctl("scoped", "--agent", "scoped")
	rec, err := c.status("scoped")
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || !strings.Contains(out, a.Fingerprint) || !strings.Contains(out, "rc=0") {
		t.Errorf("scoped: exit %d, the job did not list the controller's key %s:\n%s", code, a.Fingerprint, out)
	}
	ev := events("scoped")
	if sock, _ := ev["agent_scoped"].Fields["socket"].(string); sock == "" || !strings.Contains(out, "sock="+sock+"\n") {
		t.Errorf("scoped: the job's SSH_AUTH_SOCK is not the run's relay (%q):\n%s", sock, out)
	}
	if act := ev["action"]; act.Counts["accepted"] < 1 || act.Counts["request:identities"] < 1 {
		t.Errorf("scoped: no accepted identities request journaled: %+v", act)
	}
	if _, ok := ev["authority_revoked"]; !ok {
		t.Errorf("scoped: no authority_revoked in the journal")
	}
	if rec.State != "finished" {
		t.Errorf("scoped: state %s, want finished", rec.State)
	}

	code, out = ctl("inherit", "--agent", "inherit")
	if code != 0 || !strings.Contains(out, a.Fingerprint) || !strings.Contains(out, "sock=/tmp/ssh-") {
		t.Errorf("inherit: exit %d, want sshd's forwarded socket and the key:\n%s", code, out)
	}
	if _, ok := events("inherit")["agent_inherited"]; !ok {
		t.Errorf("inherit: no agent_inherited in the journal")
	}

	for _, tc := range []struct{ id, flag string }{{"none", "--agent=none"}, {"nomode", ""}} {
		var flags []string
		if tc.flag != "" {
			flags = []string{tc.flag}
		}
		code, out = ctl(tc.id, flags...)
		if code != 0 || !strings.Contains(out, "sock=\n") || strings.Contains(out, a.Fingerprint) || strings.Contains(out, "rc=0") {
			t.Errorf("%s: exit %d, want no agent in the job:\n%s", tc.id, code, out)
		}
		ev := events(tc.id)
		for _, name := range []string{"agent_scoped", "agent_inherited", "action"} {
			if _, ok := ev[name]; ok {
				t.Errorf("%s: %s journaled", tc.id, name)
			}
		}
	}

	if code, _ := ctl("bad", "--agent", "forward"); code != 64 {
		t.Errorf("--agent forward: exit %d, want 64", code)
	}
	if _, err := os.Stat(filepath.Join(c.ledger, "bad.json")); err == nil {
		t.Errorf("--agent forward wrote a ledger record")
	}
}

// What --agent cannot do, seen: the relay reaches the agent through the
// socket sshd made for the launch connection, so once that connection is
// lost (its ssh client SIGKILLed) and the controller has reattached, the
// job's agent requests fail, and the run goes on to its own end.
func TestSSHAgentLostWithLaunchConnection(t *testing.T) {
	t.Parallel()
	a := agenttest.Start(t)
	h := &harness{t: t, srv: sshtest.Start(t, sshtest.AllowAgentForwarding), root: t.TempDir()}
	t.Cleanup(h.killRuns)
	dir := t.TempDir()
	c := &ctlHarness{harness: h, rl: relay.Start(t, h.srv.Host()+":"+strconv.Itoa(h.srv.Port())),
		ledger: filepath.Join(dir, "ledger"), events: filepath.Join(dir, "events.jsonl")}
	rsh := strings.Replace(c.rsh(), "IdentityAgent=none", "IdentityAgent="+a.Sock, 1)
	gate := filepath.Join(dir, "go")
	job := []string{"sh", "-c", `ssh-add -l >/dev/null; echo "before=$?"; while [ ! -e "$1" ]; do sleep 0.1; done; ssh-add -l >/dev/null 2>&1; echo "after=$?"`, "sh", gate}
	args := []string{"ssh", "--rsh", rsh, "--remote-bin", bin, "--remote-root", c.root, "--ledger", c.ledger,
		"--events", c.events, "--id", "lost", "--agent", "scoped", c.srv.Destination(), "--"}
	k := &ctl{cmd: exec.Command(bin, append(args, job...)...)}
	k.cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+a.Sock)
	k.startIn(t)
	runtest.Eventually(t, "the job's first request", func() bool { return strings.Contains(k.stdout(), "before=") })
	if !strings.Contains(k.stdout(), "before=0\n") {
		t.Fatalf("the agent did not answer while the launch connection lived: %q", k.stdout())
	}
	var pid int
	runtest.Eventually(t, "the launch connection's client", func() bool { pid = k.attachClient(); return pid > 0 })
	syscall.Kill(pid, syscall.SIGKILL)
	c.waitEvent("lost", "attached", 0)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := k.wait(t); code != 0 {
		t.Fatalf("exit %d, want the run's 0\nstderr: %s", code, k.stderr())
	}
	if out := k.stdout(); !strings.Contains(out, "after=") || strings.Contains(out, "after=0\n") {
		t.Errorf("after the reattach the job's agent request did not fail: %q", out)
	}
	c.wantSettled("lost", "completed", "", 0)
}
