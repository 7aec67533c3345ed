//go:build linux

package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// authorize opens the run directory once and reads the record once: the
// run membership.Find found (by the caller's cgroup, or its session) is
// handed back open and locked with the record it judged the caller by, and
// the decision is made on that record under that lock. Counted with strace
// on the real binary, for a job found by its cgroup and for one found by its
// session (--cgroup off), each accepted and journaled.
func TestAuthorizeOneOpenOneRead(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatalf("strace is needed (.ci/deps installs it): %v", err)
	}
	t.Parallel()
	for _, c := range []struct {
		name, cgroup string
		recordReads  int
	}{
		// Found by its cgroup's name: one read of the one candidate, under
		// the lock.
		{"cgroup", "auto", 1},
		// Found by a scan of the records: the one read of the scan, and for
		// the run found one more under its lock.
		{"session", "off", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := runtest.NewRoot(t)
			id := "ao-" + c.name
			_, r := startRun(t, root, id, "--cgroup", c.cgroup, "--lease", "5m", id, "--", "sleep", "300")
			rec := r.WaitState(t, statusfile.Running)
			if c.cgroup == "auto" && rec.Cgroup == "" {
				t.Fatalf("this host gave the run no cgroup (boundary %s): the cgroup case cannot be counted here", rec.Boundary)
			}
			trace := filepath.Join(t.TempDir(), "strace.out")
			cmd := exec.Command("strace", "-f", "-qq", "-o", trace, "-e", "trace=open,openat,openat2",
				runtest.Binary(t), "--root", root, "authorize", "--pid", strconv.Itoa(rec.PID))
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("authorize under strace: %v\nstdout: %s", err, out)
			}
			if got := runtest.JSON(t, string(out)); got["decision"] != "accepted" || got["run_id"] != id {
				t.Fatalf("authorize = %s; want accepted for %s", out, id)
			}
			b, err := os.ReadFile(trace)
			if err != nil {
				t.Fatal(err)
			}
			opens := len(tracedCalls(b, `openat\(\d+, "`+regexp.QuoteMeta(id)+`", .*O_DIRECTORY`))
			reads := len(tracedCalls(b, `openat\(\d+, "status\.json", `))
			if opens != 1 || reads != c.recordReads {
				t.Fatalf("authorize opened the run directory %d times and status.json %d times; want 1 and %d\n%s",
					opens, reads, c.recordReads, b)
			}
			r.Kill()
		})
	}
}
