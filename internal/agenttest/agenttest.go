// Package agenttest starts a real OpenSSH ssh-agent for tests, holding a
// fresh ed25519 key loaded with the real ssh-add.
//
// Start guarantees: the agent listens on a socket in a fresh t.TempDir, runs
// in the foreground (-D) in its own process group as the test's child, and
// holds one key when Start returns. t.Cleanup stops it by its recorded PID
// and waits for it. Nothing is looked up by name; the user's own agent is
// never touched.
//
// Where ssh-agent, ssh-add or ssh-keygen is missing Start skips the test,
// and with CI=true fails it, as internal/sshtest does.
package agenttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Agent is a running ssh-agent.
type Agent struct {
	// Sock is the agent's socket, its SSH_AUTH_SOCK.
	Sock string
	// Key is the private key loaded at Start; Key+".pub" is its public half.
	Key string
	// Fingerprint is the key's SHA-256 fingerprint ("SHA256:...") as
	// ssh-keygen -l prints it.
	Fingerprint string
	// PID is the agent's process ID.
	PID int
}

// Start starts an agent and loads a new ed25519 key into it.
func Start(t testing.TB) *Agent {
	t.Helper()
	for _, name := range []string{"ssh-agent", "ssh-add", "ssh-keygen"} {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("agenttest: %s not found (CI=true, so this fails instead of skipping)\nhint: apt-get install openssh-client", name)
			}
			t.Skipf("agenttest: %s not found\nhint: apt-get install openssh-client", name)
		}
	}
	dir := t.TempDir()
	a := &Agent{Sock: filepath.Join(dir, "agent.sock"), Key: filepath.Join(dir, "id_ed25519")}
	cmd := exec.Command("ssh-agent", "-D", "-a", a.Sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("agenttest: ssh-agent: %v", err)
	}
	a.PID = cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err := os.Stat(a.Sock); err == nil && st.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case <-done:
			t.Fatalf("agenttest: ssh-agent exited before listening")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agenttest: ssh-agent did not listen on %s within 30s", a.Sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "agenttest", "-f", a.Key).CombinedOutput(); err != nil {
		t.Fatalf("agenttest: ssh-keygen: %v\n%s", err, out)
	}
	a.Fingerprint = Fingerprint(t, a.Key+".pub")
	a.Add(t, a.Key)
	return a
}

// Add loads the private key at path into the agent with ssh-add.
func (a *Agent) Add(t testing.TB, path string) {
	t.Helper()
	cmd := exec.Command("ssh-add", path)
	cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+a.Sock)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("agenttest: ssh-add %s: %v\n%s", path, err, out)
	}
}

// Fingerprint returns the SHA-256 fingerprint of the public key at path.
func Fingerprint(t testing.TB, pub string) string {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", pub).Output()
	if err != nil {
		t.Fatalf("agenttest: ssh-keygen -l %s: %v", pub, err)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 {
		t.Fatalf("agenttest: ssh-keygen -l %s: %q", pub, out)
	}
	return f[1]
}
