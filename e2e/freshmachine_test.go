package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// On a machine without openssh-server this package never says "ok" with
// every test skipped: it fails at once, naming what to install, and runs no
// test. Shown by pointing sshd's path at nothing (SSHTEST_SSHD).
func TestWithoutSSHDFailsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDisconnectNoPTYRunsUntilLease$", "-test.v")
	cmd.Env = append(os.Environ(), "SSHTEST_SSHD=/nonexistent/sshd", "CI=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || time.Since(start) > 20*time.Second {
		t.Fatalf("e2e without sshd: %v after %v, want exit 1 at once\n%s", err, time.Since(start), out)
	}
	for _, want := range []string{"sshd not found at /nonexistent/sshd", "apt-get install openssh-server"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "=== RUN") || strings.Contains(string(out), "\nok") {
		t.Errorf("tests ran, or ok was printed:\n%s", out)
	}
}

// `make test` on a fresh machine: .ci/deps either installs what is missing
// (root with apt-get) or stops, naming the packages and the one command to
// install them. --check only names them; here sshd is made to look missing.
func TestDepsNamesWhatIsMissing(t *testing.T) {
	cmd := exec.Command("../.ci/deps", "--check")
	cmd.Env = append(os.Environ(), "SSHTEST_SSHD=/nonexistent/sshd")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf(".ci/deps --check without sshd: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{"make test needs packages that are not installed: openssh-server", "install them with: sudo apt-get install -y openssh-server"} {
		if !strings.Contains(string(out), want) {
			t.Errorf(".ci/deps output lacks %q:\n%s", want, out)
		}
	}
	// This machine runs the e2e tests, so it has everything: nothing to say.
	if out, err := exec.Command("../.ci/deps", "--check").CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf(".ci/deps --check here: %v\n%s", err, out)
	}
}

// Under CI=true a skipped test fails the run (.ci/noskip, used by make test).
func TestNoSkipUnderCI(t *testing.T) {
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"echo '--- PASS: TestA (0.00s)'; echo '    --- SKIP: TestB/c (0.00s)'; echo ok", 1},
		{"echo '--- PASS: TestA (0.00s)'; echo ok", 0},
		{"echo '--- FAIL: TestA (0.00s)'; exit 1", 1},
	} {
		out, err := exec.Command("../.ci/noskip", "sh", "-c", tc.script).CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf(".ci/noskip sh -c %q: exit %d, want %d\n%s", tc.script, code, tc.code, out)
		}
	}
	// A test that prints a binary byte: the lines after it are still shown
	// and still judged (grep -a), not summed up as "binary file matches".
	out, _ := exec.Command("../.ci/noskip", "sh", "-c",
		`printf 'noise \000\377\n--- FAIL: TestA (0.00s)\n    --- SKIP: TestB/c (0.00s)\n'`).CombinedOutput()
	for _, want := range []string{"\n--- FAIL: TestA (0.00s)\n", "\n    --- SKIP: TestB/c (0.00s)\n    --- SKIP: TestB/c (0.00s)\nFAIL: the tests above were skipped"} {
		if !strings.Contains(string(out), want) {
			t.Errorf(".ci/noskip on output with binary bytes lacks %q:\n%q", want, out)
		}
	}
}
