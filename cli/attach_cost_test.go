//go:build linux

package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

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
	if scans := tracedCalls(b, `openat\([^,]+, "/proc/?", `); len(scans) > 0 {
		t.Errorf("attach listed /proc %d times while following a live run; want none\n%s", len(scans), scans)
	}
	stats := tracedCalls(b, `openat\([^,]+, "/proc/\d+/stat", `)
	if len(stats) > 20 {
		t.Errorf("attach read %d /proc/PID/stat files following one run; want a few (the wrapper's, once a judgement)", len(stats))
	}
	t.Logf("/proc/PID/stat opens: %d", len(stats))
}

// TestFollowersSleepOnTheWrapper: wait, logs -f and attach following a
// quiet live run hold its wrapper by a pidfd and sleep on it and (after
// their first second) on the run directory's inotify watch, with no timer
// of their own shorter than 30 s; when the wrapper
// is SIGKILLed (and its job with it, so the outcome is unknown) each wakes
// from the pidfd and ends with the unknown outcome's code after the 3 s
// settle, long before that backstop.
func TestFollowersSleepOnTheWrapper(t *testing.T) {
	t.Parallel()
	root := runtest.NewRoot(t)
	const id = "follow-pin"
	c, r := startRun(t, root, id, "--lease", "0", "--no-stream", id, "--", "sleep", "300")
	rec := r.WaitState(t, statusfile.Running)
	followers := map[string]*runtest.Cmd{
		"wait":    runtest.Start(t, root, "wait", id),
		"logs -f": runtest.Start(t, root, "logs", "-f", id),
		"attach":  runtest.Start(t, root, "attach", "--from", "0,0", id),
	}
	for name, f := range followers {
		runtest.Eventually(t, name+" holding a pidfd", func() bool { return holdsPidfd(f.Process.Pid) })
	}
	killWrapper(t, c, rec)
	runtest.KillGroup(rec.PGID, rec.LeaderStart)
	want := map[string]int{"wait": 75, "logs -f": 4, "attach": 75}
	start := time.Now()
	for name, f := range followers {
		code := f.Wait(t)
		if code != want[name] {
			t.Errorf("%s exited %d, want %d (outcome unknown)\nstderr: %s", name, code, want[name], f.Stderr.String())
		}
	}
	if took := time.Since(start); took > 25*time.Second {
		t.Errorf("the followers ended %v after the wrapper died: they slept out their backstop instead of waking on its pidfd", took)
	}
}

// holdsPidfd reports whether the process has a pidfd open.
func holdsPidfd(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && l == "anon_inode:[pidfd]" {
			return true
		}
	}
	return false
}

// TestFollowersOfAnEndedRunSetUpNoWatch: wait, attach and logs -f of a run
// that is over return without creating an inotify instance, whose close at
// exit would cost them an SRCU grace period (8-12 ms here) for nothing:
// the watch is set up only after a follower has waited a second.
func TestFollowersOfAnEndedRunSetUpNoWatch(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatalf("strace is needed (.ci/deps installs it): %v", err)
	}
	t.Parallel()
	root := runtest.NewRoot(t)
	const id = "ended-follow"
	if code, _, errOut := runtest.Exec(t, root, "run", "--no-stream", "--lease", "0", id, "--", "sh", "-c", "echo hi; exit 3"); code != 3 {
		t.Fatalf("run: exit %d: %s", code, errOut)
	}
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"wait", id}, 3, ""},
		{[]string{"attach", "--from", "0,0", id}, 3, "hi\n"},
		{[]string{"logs", "-f", id}, 0, "hi\n"},
	} {
		trace := filepath.Join(t.TempDir(), "strace.out")
		cmd := exec.Command("strace", append([]string{"-f", "-qq", "-o", trace, "-e", "trace=inotify_init,inotify_init1",
			runtest.Binary(t), "--root", root}, c.args...)...)
		out, err := cmd.Output()
		if code := cmd.ProcessState.ExitCode(); code != c.code || string(out) != c.out {
			t.Fatalf("%v: exit %d (%v), output %q; want %d, %q", c.args, code, err, out, c.code, c.out)
		}
		b, err := os.ReadFile(trace)
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`inotify_init`).Match(b) {
			t.Errorf("%v created an inotify instance for a run that was over:\n%s", c.args, b)
		}
	}
}
