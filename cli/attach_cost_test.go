//go:build linux

package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// TestAttachNoProcessScan: following a live run (attach, and so wait and
// logs -f, which share its follower) re-judges the run every second from
// its record and its wrapper's /proc entry, never by listing /proc: a
// host with hundreds of attached runs must not pay hundreds of scans of
// every process a second. Counted with strace over about three seconds
// of a live run (three judgements) and its end.
func TestAttachNoProcessScan(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatalf("strace is needed (.ci/deps installs it): %v", err)
	}
	t.Parallel()
	root := runtest.NewRoot(t)
	const id = "attach-cost"
	_, r := startRun(t, root, id, "--lease", "5m", id, "--", "sh", "-c", "echo up; sleep 3; echo down")
	r.WaitState(t, statusfile.Running)
	trace := filepath.Join(t.TempDir(), "strace.out")
	cmd := exec.Command("strace", "-f", "-qq", "-o", trace, "-e", "trace=open,openat,openat2",
		runtest.Binary(t), "--root", root, "attach", "--from", "0,0", id)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("attach under strace: %v\nstdout: %s", err, out)
	}
	if string(out) != "up\ndown\n" {
		t.Fatalf("attach streamed %q, want the job's two lines", out)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	if scans := regexp.MustCompile(`(?m)^\d+ +openat\([^,]+, "/proc/?", .*= \d+$`).FindAll(b, -1); len(scans) > 0 {
		t.Errorf("attach listed /proc %d times while following a live run; want none\n%s", len(scans), scans)
	}
	stats := regexp.MustCompile(`(?m)^\d+ +openat\([^,]+, "/proc/\d+/stat", .*= \d+$`).FindAll(b, -1)
	if len(stats) > 20 {
		t.Errorf("attach read %d /proc/PID/stat files following one run; want a few (the wrapper's, once a judgement)", len(stats))
	}
	t.Logf("/proc/PID/stat opens: %d", len(stats))
}
