package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/deploy"
	"github.com/agent-wrap/agent-wrap/internal/flock"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
)

// testUser is the account TestDeployUserReach deploys to when the test runs
// as root: deploy --user is for accounts like it, whose non-interactive ssh
// PATH (sshd's default) lacks ~/.local/bin.
const testUser = "aw-deploy-test"

// testUserLock serialises the tests that use testUser across processes.
const testUserLock = "/tmp/agent-wrap-deploy-test.lock"

// deployUser returns a non-root account to deploy to over loopback ssh and
// its home: the test's own when it is not root, else testUser (made with
// useradd if missing, its earlier install removed).
func deployUser(t *testing.T) (name, home string) {
	t.Helper()
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		return u.Username, u.HomeDir
	}
	// One account serves every run of this test on the machine, so two
	// `make test`s side by side would remove each other's install: hold a
	// machine-wide lock for the test's life (released when the file closes).
	lf, err := os.OpenFile(testUserLock, os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lf.Close() })
	if err := flock.Lock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("flock %s: %v", testUserLock, err)
	}
	if _, err := user.Lookup(testUser); err != nil {
		out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/bash", testUser).CombinedOutput()
		if err != nil {
			t.Fatalf("useradd %s: %v\n%s", testUser, err, out)
		}
	}
	// sshd without PAM refuses an account whose password field is locked
	// ("!"); "*" allows key logins and no password.
	if out, err := exec.Command("usermod", "-p", "*", testUser).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v\n%s", err, out)
	}
	u, err := user.Lookup(testUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{".local", ".config", ".agent-runs"} {
		if err := os.RemoveAll(filepath.Join(u.HomeDir, d)); err != nil {
			t.Fatal(err)
		}
	}
	return u.Username, u.HomeDir
}

// Deploy never says ok for a binary a controller cannot reach: after
// `deploy --user` (~/.local/bin is not on sshd's PATH) a plain `ssh host
// agent-wrap ...` would get "command not found" (127). Deploy calls `ssh
// HOST agent-wrap version` as a controller would; where that fails it says
// so (exit 1), names the binary's absolute path for --remote-bin, and
// offers the fixes. `deploy --cron` to a host without cron is refused,
// naming what is missing.
func TestDeployUserReach(t *testing.T) {
	d := distDir(t)
	s := sshtest.Start(t)
	name, home := deployUser(t)
	dest := s.DestinationFor(name)
	workstation := filepath.Join(d, "agent-wrap-linux-amd64")
	bin := filepath.Join(home, ".local/bin/agent-wrap")

	args := append([]string{"deploy"}, s.SSHArgs()...)
	args = append(args, "--dist", d, "--systemd", "--user", dest)
	out, errOut, code := run(t, workstation, args...)
	wantLine := dest + " failed: installed " + bin + ", but it is not reachable as 'agent-wrap' by a non-interactive ssh command: " +
		"'ssh " + dest + " agent-wrap version' fails: "
	if code != 1 || !strings.HasPrefix(out, wantLine) || !strings.Contains(out, "command not found") || strings.Count(out, "\n") != 1 {
		t.Fatalf("deploy --user: exit %d, stdout %q; want 1 and one line starting %q, saying command not found\nstderr: %s\nsshd log:\n%s",
			code, out, wantLine, errOut, s.Log())
	}
	for _, want := range []string{
		"agent-wrap: hint: " + dest + ": call it by its path: agent-wrap ssh --remote-bin " + bin + " " + dest + " -- CMD",
		`export PATH="$HOME/.local/bin:$PATH"`,
		"~/.ssh/environment: PATH=" + filepath.Dir(bin) + ":/usr/local/bin:",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("deploy --user: stderr lacks %q:\n%s", want, errOut)
		}
	}
	// The path it names is the one that works.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := s.CommandWith(ctx, nil, sshtest.Quote(bin, "version")).Output()
	if err != nil || !strings.HasPrefix(string(got), "agent-wrap ") {
		t.Errorf("ssh %s %s version: %v: %q", dest, bin, err, got)
	}
	// (CommandWith logs in as the test's user; as the deploy user too:)
	cmd := exec.CommandContext(ctx, "ssh", append(s.SSHArgs(), "--", dest, sshtest.Quote(bin, "version"))...)
	if got, err := cmd.Output(); err != nil || !strings.HasPrefix(string(got), "agent-wrap ") {
		t.Errorf("ssh %s %s version: %v: %q", dest, bin, err, got)
	}

	t.Run("cron-missing", func(t *testing.T) {
		if missing := deploy.CronMissing(true); len(missing) == 0 {
			t.Skip("cron is installed on this machine; TestInstallCronRefusedWithoutCron (cli) simulates a host without it")
		}
		args := append([]string{"deploy"}, s.SSHArgs()...)
		args = append(args, "--dist", d, "--cron", "--user", dest)
		out, errOut, code := run(t, workstation, args...)
		want := dest + " failed: install: agent-wrap: install --cron: nothing here would run the watchdog: missing a cron daemon"
		if code != 1 || !strings.HasPrefix(out, want) {
			t.Errorf("deploy --cron --user: exit %d, stdout %q; want 1 and %q\nstderr: %s", code, out, want, errOut)
		}
	})
}

// Fixes: the absolute path first; a link where a directory on the PATH is
// writable; the shell's startup line; ~/.ssh/environment.
func TestReachFixes(t *testing.T) {
	r := deploy.ParseReach("/home/al/.local/bin/agent-wrap",
		"path /usr/local/bin:/usr/bin:/bin\nhome /home/al\nshell /bin/bash\nwritable /usr/local/bin\n")
	fixes := strings.Join(r.Fixes(), "\n")
	for _, want := range []string{
		"--remote-bin /home/al/.local/bin/agent-wrap HOST",
		"ln -s /home/al/.local/bin/agent-wrap /usr/local/bin/agent-wrap",
		`export PATH="$HOME/.local/bin:$PATH"`,
		"PATH=/home/al/.local/bin:/usr/local/bin:/usr/bin:/bin",
	} {
		if !strings.Contains(fixes, want) {
			t.Errorf("fixes lack %q:\n%s", want, fixes)
		}
	}
	if r.OnPath() {
		t.Errorf("OnPath for a binary that is not on the PATH")
	}
}
