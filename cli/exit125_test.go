//go:build linux

package cli_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
)

// nobody is the account the test runs agent-wrap as when it runs as root:
// root may write anywhere, so it cannot meet a read-only root.
const nobody = 65534

// asUser runs the built binary with args, as nobody when the test is root
// (else as the test's own user), and returns its exit code and stderr.
func asUser(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent"}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("%v: %v", args, err)
	return 0, ""
}

// nobodysBinary makes a directory every account may enter (0755, outside
// the test's own 0700 temporary directory, removed at cleanup) holding a
// copy of the binary nobody can run, and returns both paths.
func nobodysBinary(t *testing.T, prefix string) (base, bin string) {
	t.Helper()
	base, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(runtest.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(base, "agent-wrap")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return base, bin
}

// agent-wrap's own failure before the job starts exits 125,
// the message names what failed once (no "run r1: run r1:"), with its path,
// and a hint says what to do. A read-only run root, and a root whose parent
// cannot be made.
func TestOwnFailureExits125(t *testing.T) {
	base, bin := nobodysBinary(t, "aw-exit125-")
	ro := filepath.Join(base, "ro")
	locked := filepath.Join(base, "locked")
	for _, d := range []string{ro, locked} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(ro, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(ro, 0o500); err != nil { // the owner's, read-only
		t.Fatal(err)
	}
	if err := os.Chmod(locked, 0o555); err != nil { // not the user's, not writable
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(locked, 0o755); os.Chmod(ro, 0o700) })

	for _, tc := range []struct {
		name, root, path string
	}{
		{"read-only-root", ro, filepath.Join(ro, "r1")},
		{"parent-not-creatable", filepath.Join(locked, "deep", "x"), filepath.Join(locked, "deep")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{
				{"--root", tc.root, "r1", "--", "true"},
				{"--root", tc.root, "run", "--detach", "r1", "--", "true"},
			} {
				code, stderr := asUser(t, bin, args...)
				if code != 125 {
					t.Errorf("%v: exit %d, want 125\n%s", args, code, stderr)
				}
				if strings.Contains(stderr, "run r1: run r1") || strings.Count(stderr, "permission denied") != 1 {
					t.Errorf("%v: the failure is not said exactly once:\n%s", args, stderr)
				}
				if !strings.Contains(stderr, tc.path) || !strings.Contains(stderr, "agent-wrap: hint: ") {
					t.Errorf("%v: stderr lacks the path %s or a hint:\n%s", args, tc.path, stderr)
				}
				if strings.Contains(stderr, "no runs were ever started") {
					t.Errorf("%v: claims no runs were started:\n%s", args, stderr)
				}
			}
			if _, err := os.Lstat(filepath.Join(tc.root, "r1")); err == nil {
				t.Errorf("run directory made despite the failure")
			}
		})
	}
}
