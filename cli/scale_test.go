//go:build linux

package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// scaleRuns is the host-scale case at the size of `make test`; `make bench`
// runs it at 1000 (awbench's scale figure).
const scaleRuns = 50

// Many runs on one host at once, then every one cancelled at once: nothing
// lost, nothing left. scaleRuns runs of `sleep 300` start, each under its
// own wrapper; list shows every one running and the watchdog leaves them
// alone; then one `cancel` per run, all started before the first is waited
// for. Every cancel confirms (exit 0), every wrapper exits 143, every
// record is cancelled with exit 143 and no survivors, no process of any
// run's group and no run cgroup is left, and list shows every run
// cancelled.
func TestScaleStartThenCancelAll(t *testing.T) {
	t.Parallel()
	root := runtest.NewRoot(t)
	runs := make([]runtest.Run, scaleRuns)
	wrappers := make([]*runtest.Cmd, scaleRuns)
	for i := range runs {
		id := fmt.Sprintf("sc-%02d", i)
		r := runtest.Run{Root: root, ID: id}
		// Cleanup kills what is left of a run that did not end confirmed.
		// A confirmed one (terminal, no survivors) has nothing left: by
		// then its group number may be another program's.
		t.Cleanup(func() {
			if rec := r.Status(); rec == nil || !statusfile.Terminal(rec.State) || len(rec.Survivors) > 0 {
				r.Kill()
			}
		})
		runs[i] = r
		wrappers[i] = runtest.Start(t, root, "run", "--no-stream", "--lease", "5m", id, "--", "sleep", "300")
	}
	recs := make([]*statusfile.Record, scaleRuns)
	for i, r := range runs {
		recs[i] = r.WaitState(t, statusfile.Running)
	}

	wantList(t, root, statusfile.Running, "running")
	code, out, stderr := aw(t, root, "watchdog", "--once")
	if code != 0 || strings.TrimSpace(out) != "" {
		t.Fatalf("watchdog --once over %d live runs: exit %d, printed %q (%s); want 0 and no action", scaleRuns, code, out, stderr)
	}

	cancels := make([]*runtest.Cmd, scaleRuns)
	for i, r := range runs {
		cancels[i] = runtest.Start(t, root, "cancel", r.ID)
	}
	for i, c := range cancels {
		if code := c.Wait(t); code != 0 {
			t.Errorf("cancel %s: exit %d, want 0 (confirmed)\n%s%s", runs[i].ID, code, c.Stdout.String(), c.Stderr.String())
		}
	}
	for i, w := range wrappers {
		if code := w.Wait(t); code != 143 {
			t.Errorf("run %s: the wrapper exited %d, want 143", runs[i].ID, code)
		}
	}
	for i, r := range runs {
		rec := r.MustStatus(t)
		if rec.State != statusfile.Cancelled || rec.Code() != 143 || rec.Survivors == nil || len(rec.Survivors) != 0 {
			t.Errorf("run %s: state %s, exit %d, survivors %v; want cancelled, 143, []", r.ID, rec.State, rec.Code(), rec.Survivors)
		}
		r.AssertGroupEmpty(t)
		if cg := recs[i].Cgroup; cg != "" {
			if !filepath.IsAbs(cg) {
				t.Fatalf("run %s: cgroup %q is not an absolute path", r.ID, cg)
			}
			if _, err := os.Stat(cg); !os.IsNotExist(err) {
				t.Errorf("run %s: its cgroup %s is still there (%v)", r.ID, cg, err)
			}
		}
	}
	wantList(t, root, statusfile.Cancelled, "cancelled")
	wantOneScan(t, root)
}

// wantOneScan checks that list over the scale test's cancelled runs,
// whose outcomes depend on whether anything of them is alive, reads the
// process table once for all of them, not once per run: its opens of
// /proc itself are counted with strace.
func wantOneScan(t *testing.T, root string) {
	t.Helper()
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatalf("strace is needed (.ci/deps installs it): %v", err)
	}
	trace := filepath.Join(t.TempDir(), "strace.out")
	cmd := exec.Command("strace", "-f", "-qq", "-o", trace, "-e", "trace=open,openat,openat2",
		runtest.Binary(t), "--root", root, "list", "--json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("list under strace: %v\n%s", err, out)
	}
	if n := len(strings.Split(strings.TrimSpace(string(out)), "\n")); n != scaleRuns {
		t.Fatalf("list under strace printed %d runs, want %d", n, scaleRuns)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	scans := tracedCalls(b, `open(at)?\((AT_FDCWD, )?"/proc", `)
	if len(scans) != 1 {
		t.Fatalf("list over %d cancelled runs read the process table %d times; want once\n%s", scaleRuns, len(scans), scans)
	}
}

// wantList checks that list --json names every run of the scale test, each
// in state with outcome.
func wantList(t *testing.T, root, state, outcome string) {
	t.Helper()
	code, out, stderr := aw(t, root, "list", "--json")
	if code != 0 {
		t.Fatalf("list --json: exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != scaleRuns {
		t.Fatalf("list --json printed %d runs, want %d:\n%s", len(lines), scaleRuns, out)
	}
	for i, l := range lines {
		var row struct {
			RunID   string `json:"run_id"`
			State   string `json:"state"`
			Outcome string `json:"outcome"`
		}
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			t.Fatalf("list --json line %d: %v: %q", i+1, err, l)
		}
		if want := fmt.Sprintf("sc-%02d", i); row.RunID != want || row.State != state || row.Outcome != outcome {
			t.Fatalf("list --json line %d: %s %s %s; want %s %s %s (in order)", i+1, row.RunID, row.State, row.Outcome, want, state, outcome)
		}
	}
}
