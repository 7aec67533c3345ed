//go:build linux

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/deploy"
)

// On a host with no cron daemon and no crontab program, `install --cron`
// refuses, naming what is missing, before writing anything: files written
// and success reported there would leave no watchdog ever running. The host without cron is simulated: an empty PATH and
// no system directories to search.
func TestInstallCronRefusedWithoutCron(t *testing.T) {
	old := deploy.CronDirs
	deploy.CronDirs = nil
	t.Cleanup(func() { deploy.CronDirs = old })
	t.Setenv("PATH", t.TempDir())
	home := t.TempDir()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--cron", "--user"}, []string{"a cron daemon", "the crontab program"}},
		{[]string{"--cron"}, []string{"a cron daemon"}},
		{[]string{"--cron", "--user", "--dry-run"}, []string{"a cron daemon"}},
	} {
		var out, errb bytes.Buffer
		e := &Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
			return map[string]string{"HOME": home, "AGENT_WRAP_ROOT": filepath.Join(home, "runs")}[k]
		}}
		code := e.Run(append([]string{"install"}, tc.args...))
		if code != ExitFailure {
			t.Errorf("install %v: exit %d, want 1\nstdout: %s\nstderr: %s", tc.args, code, out.String(), errb.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("install %v: stderr lacks %q:\n%s", tc.args, w, errb.String())
			}
		}
		if !strings.Contains(errb.String(), "nothing was installed") {
			t.Errorf("install %v: stderr does not say nothing was installed:\n%s", tc.args, errb.String())
		}
	}
	for _, p := range []string{".local/bin/agent-wrap", ".config/agent-wrap/watchdog.crontab", "runs"} {
		if _, err := os.Lstat(filepath.Join(home, p)); err == nil {
			t.Errorf("%s was written although install refused", p)
		}
	}
}

// Where cron is there (here: a cron daemon and a crontab program on PATH,
// the crontab a script that keeps what it is given), install --cron --user
// installs, activates, and, since ~/.local/bin is not on sshd's default
// PATH, says so with the absolute path to use and the fixes.
func TestInstallCronUserNotesReach(t *testing.T) {
	old := deploy.CronDirs
	deploy.CronDirs = nil
	t.Cleanup(func() { deploy.CronDirs = old })
	bin := t.TempDir()
	kept := filepath.Join(t.TempDir(), "crontab.txt")
	for name, body := range map[string]string{
		"cron":    "#!/bin/sh\nexit 0\n",
		"crontab": "#!/bin/sh\n[ \"$1\" = -l ] && exit 1\ncat >" + kept + "\n",
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":/usr/bin:/bin")
	home := t.TempDir()
	var out, errb bytes.Buffer
	e := &Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"HOME": home, "AGENT_WRAP_ROOT": filepath.Join(home, "runs"), "SHELL": "/bin/bash"}[k]
	}}
	if code := e.Run([]string{"install", "--cron", "--user"}); code != 0 {
		t.Fatalf("install --cron --user: exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
	installed := filepath.Join(home, ".local/bin/agent-wrap")
	for _, want := range []string{
		"installed: " + installed + "\n",
		"ran: (crontab -l",
		"note: 'ssh HOST agent-wrap' will not find " + installed,
		"note: call it by its path: agent-wrap ssh --remote-bin " + installed,
		`export PATH="$HOME/.local/bin:$PATH"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("install output lacks %q:\n%s", want, out.String())
		}
	}
	if b, err := os.ReadFile(kept); err != nil || !strings.Contains(string(b), installed+" --root "+filepath.Join(home, "runs")+" watchdog --once") {
		t.Errorf("crontab was given (%v):\n%s", err, b)
	}
}

// A host with neither systemd nor cron (simulated as above): the refusal
// of --cron names --binary-only, and --binary-only installs the binary
// alone, exit 0, printing the watchdog line to keep running.
func TestInstallBinaryOnlyWithoutCron(t *testing.T) {
	old := deploy.CronDirs
	deploy.CronDirs = nil
	t.Cleanup(func() { deploy.CronDirs = old })
	t.Setenv("PATH", t.TempDir())
	home := t.TempDir()
	env := func(k string) string {
		return map[string]string{"HOME": home, "AGENT_WRAP_ROOT": filepath.Join(home, "runs")}[k]
	}
	var out, errb bytes.Buffer
	if code := (&Env{Stdout: &out, Stderr: &errb, Getenv: env}).Run([]string{"install", "--cron", "--user"}); code != ExitFailure ||
		!strings.Contains(errb.String(), "install --binary-only installs the binary alone") {
		t.Errorf("install --cron --user without cron: exit %d, want 1 and a hint naming --binary-only:\n%s", code, errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := (&Env{Stdout: &out, Stderr: &errb, Getenv: env}).Run([]string{"install", "--binary-only", "--user"}); code != ExitOK {
		t.Fatalf("install --binary-only --user: exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
	bin := filepath.Join(home, ".local/bin/agent-wrap")
	want := "\nnext: " + bin + " --root " + filepath.Join(home, "runs") + " watchdog --interval 5s\n"
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "nothing here keeps it running (binary only)") {
		t.Errorf("install --binary-only --user: stdout lacks %q:\n%s", want, out.String())
	}
	if _, err := os.Stat(bin); err != nil {
		t.Errorf("the binary was not installed: %v", err)
	}
	for _, p := range []string{".config/agent-wrap/watchdog.crontab", ".config/systemd"} {
		if _, err := os.Lstat(filepath.Join(home, p)); err == nil {
			t.Errorf("%s was written by a binary-only install", p)
		}
	}
	if code := (&Env{Stdout: &out, Stderr: &errb, Getenv: env}).Run([]string{"install", "--binary-only", "--cron"}); code != ExitUsage {
		t.Errorf("install --binary-only --cron: exit %d, want 64", code)
	}
}
