package soak

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
)

// No record, journal or log written by agent-wrap itself holds an
// environment value. The wrapper and every command run with a
// secret-looking variable in their environment; the job inherits it (it
// checks, without printing it), runs a group member and an escaped
// descendant, and is renewed, cancelled, watched and reconciled. Then every
// file under the root that agent-wrap wrote (all but the job's own
// stdout.log and stderr.log), and every command's own output, is searched
// for the value.
func TestNoEnvironmentValueWritten(t *testing.T) {
	secret := fmt.Sprintf("s3cr3t-%d-%x", os.Getpid(), time.Now().UnixNano())
	env := []string{"AGENT_SECRET_TOKEN=" + secret}
	root := runtest.NewRoot(t)
	tmp := t.TempDir()
	var outputs []string
	run := func(args ...string) int {
		code, out, errs := aw(t, env, append([]string{"--root", root}, args...)...)
		outputs = append(outputs, out, errs)
		return code
	}
	// The job checks that it inherited the variable without printing it.
	job := func(id string) []string {
		return []string{"sh", "-c", `test -n "$AGENT_SECRET_TOKEN" && echo has-secret; echo $$ > ` + tmp + `/` + id + `.pid; sleep 30 & setsid sleep 30 & wait`}
	}

	// A run that is renewed, then cancelled from outside.
	args := append([]string{"run", "--detach", "--grace", "1", "--lease", "10", "sec-cancel", "--"}, job("sec-cancel")...)
	if code := run(args...); code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", code, strings.Join(outputs, "\n"))
	}
	r1 := runtest.Run{Root: root, ID: "sec-cancel"}
	t.Cleanup(r1.Kill)
	r1.WaitState(t, "running")
	runtest.Eventually(t, "the escape to be recorded", func() bool { s := r1.Status(); return s != nil && len(s.Escaped) > 0 })
	if code := run("renew", "sec-cancel"); code != 0 {
		t.Errorf("renew: exit %d", code)
	}
	if code := run("cancel", "sec-cancel"); code != 0 {
		t.Errorf("cancel: exit %d", code)
	}
	r1.AssertGroupEmpty(t)

	// A run whose lease expires after its wrapper is gone: the watchdog
	// stops it.
	args = append([]string{"run", "--detach", "--grace", "1", "--lease", "1", "sec-lease", "--"}, job("sec-lease")...)
	if code := run(args...); code != 0 {
		t.Fatalf("run --detach: exit %d", code)
	}
	r2 := runtest.Run{Root: root, ID: "sec-lease"}
	t.Cleanup(r2.Kill)
	r2.WaitState(t, "cancelled", "cancelling")
	r2.WaitState(t, "cancelled")

	// A run that finishes in the foreground, and one that fails to launch.
	run("run", "--lease", "0", "sec-fin", "--", "sh", "-c", "echo done")
	run("run", "sec-lf", "--", "/nonexistent/agent-wrap-test")
	run("watchdog", "--once")
	run("reconcile", "--all")
	run("reconcile", "--json", "--all")
	run("list", "--json")
	run("status", "sec-cancel")
	run("verify", "sec-cancel")
	run("logs", "sec-fin")

	// The job did inherit the variable: its environment is the wrapper's,
	// not agent-wrap's to strip.
	if !strings.Contains(r1.File("stdout.log"), "has-secret") {
		t.Errorf("the job did not see AGENT_SECRET_TOKEN: stdout.log %q", r1.File("stdout.log"))
	}
	files := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() == "stdout.log" || d.Name() == "stderr.log" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the environment value:\n%s", p, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outputs {
		if strings.Contains(o, secret) {
			t.Errorf("a command printed the environment value:\n%s", o)
		}
	}
	if files < 17 {
		t.Errorf("searched only %d files; expected every run's record, journal, pid, pgid, deadline", files)
	}
	t.Logf("searched %d files written by agent-wrap and %d command outputs: no environment value", files, len(outputs))
}
