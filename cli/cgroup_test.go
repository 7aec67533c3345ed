//go:build linux

package cli_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// needCgroup skips where no writable cgroup v2 subtree exists, except under
// CI, whose machines have one: there its absence is a failure.
func needCgroup(t *testing.T) {
	t.Helper()
	g, err := cgroup.Create("probe." + strings.ReplaceAll(t.Name(), "/", "_"))
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI machines have a writable cgroup v2 tree, but: %v", err)
		}
		t.Skipf("no writable cgroup v2 subtree here: %v", err)
	}
	g.Close()
	cgroup.Remove(g.Path)
}

// With a writable cgroup v2 subtree, a run gets its own cgroup (recorded as
// its boundary), its job starts inside it, and the cgroup is removed when
// the run ends. With --cgroup off, the boundary is the session and the
// subreaper tree.
func TestCgroupBoundary(t *testing.T) {
	needCgroup(t)
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "cg", "cg", "--", "sleep", "300")
	rec := r.WaitState(t, statusfile.Running)
	if rec.Boundary != "cgroup" || !cgroup.Valid(rec.Cgroup) {
		t.Fatalf("boundary %q cgroup %q", rec.Boundary, rec.Cgroup)
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(rec.PID) + "/cgroup")
	if !strings.Contains(string(b), "/"+cgroup.Parent+"/cg.") {
		t.Fatalf("the job is not in the run's cgroup: %s", b)
	}
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	c.Wait(t)
	r.AssertGroupEmpty(t)
	if _, err := os.Stat(rec.Cgroup); !os.IsNotExist(err) {
		t.Fatalf("the run's cgroup was left behind: %v", err)
	}

	// A launch that fails (command not found) after the cgroup was made
	// for it: the cgroup is removed and the record does not name it.
	c, r = startRun(t, root, "nocmd", "nocmd", "--", "/nonexistent/agent-wrap-test")
	if code := c.Wait(t); code != 127 {
		t.Fatalf("command not found: exit %d, want 127\n%s", code, c.Stderr.String())
	}
	if rec := r.MustStatus(t); rec.State != statusfile.LaunchFailed || rec.Boundary != "session+subreaper" || rec.Cgroup != "" {
		t.Fatalf("launch failed: state %s boundary %q cgroup %q", rec.State, rec.Boundary, rec.Cgroup)
	}
	mnt, err := cgroup.Mount()
	if err != nil {
		t.Fatal(err)
	}
	self, err := cgroup.Self()
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(mnt, self, cgroup.Parent))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "nocmd.") {
			t.Fatalf("the failed launch left its cgroup %s behind", e.Name())
		}
	}

	c, r = startRun(t, root, "nocg", "--cgroup", "off", "nocg", "--", "sleep", "300")
	rec = r.WaitState(t, statusfile.Running)
	if rec.Boundary != "session+subreaper" || rec.Cgroup != "" {
		t.Fatalf("--cgroup off: boundary %q cgroup %q", rec.Boundary, rec.Cgroup)
	}
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	c.Wait(t)
	r.AssertGroupEmpty(t)
}

// What only a cgroup catches: the wrapper is SIGKILLed, and only then does
// the job start a process in a new session. No one saw it escape, so it is
// in no record, but it is in the run's cgroup: cancel finds it there and
// stops it (cgroup.kill), and nothing outside the run is touched.
func TestCgroupCatchesUnrecordedEscape(t *testing.T) {
	needCgroup(t)
	root := runtest.NewRoot(t)
	flag := t.TempDir() + "/go"
	job := "trap '' TERM; while [ ! -e " + flag + " ]; do sleep 0.05; done; setsid sleep 303 & wait"
	c, r := startRun(t, root, "late", "--grace", "1s", "late", "--", "sh", "-c", job)
	rec := r.WaitState(t, statusfile.Running)
	unix.Kill(rec.WrapperPID, unix.SIGKILL)
	c.Wait(t)
	os.WriteFile(flag, nil, 0o600) // now the job escapes, with no wrapper watching
	var esc proc.Stat
	runtest.Eventually(t, "the unrecorded escape in the run's cgroup", func() bool {
		pids, _ := cgroup.Procs(rec.Cgroup)
		for _, p := range pids {
			st, err := proc.ReadStat(p)
			if err == nil && st.SID != rec.SID && !st.Dead() {
				esc = st
				return true
			}
		}
		return false
	})
	if got := r.MustStatus(t).Escaped; len(got) != 0 {
		t.Fatalf("the escape was recorded (%v): this test needs one that was not", got)
	}
	code, out, stderr := aw(t, root, "cancel", "late")
	if code != 0 {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, stderr)
	}
	r.AssertGroupEmpty(t)
	if proc.Alive(esc.PID, esc.Start) {
		t.Fatalf("the escape %d outside the group and the record survived", esc.PID)
	}
	found := false
	for _, e := range r.Journal(t) {
		found = found || (e.Event == "signal_sent" && e.Fields["target"] == "cgroup")
	}
	if !found {
		t.Fatalf("no cgroup.kill journaled: %v", r.Events(t))
	}
}
