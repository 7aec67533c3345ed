package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/deploy"
)

// Issue 15 (5): on a host with no cron daemon and no crontab program,
// `install --cron` used to write its files and report success, and no
// watchdog would ever run. It refuses now, naming what is missing, before
// writing anything. The host without cron is simulated: an empty PATH and
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
