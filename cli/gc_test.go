//go:build linux

package cli_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// gc --older-than removes the runs that are over and ended long enough ago
// (finished, launch failed, cancelled), and keeps a recent one, a running
// one and one whose outcome is unknown, even when their records claim an
// old ended_at.
func TestGCKeepsLiveAndUnknown(t *testing.T) {
	root := runtest.NewRoot(t)
	aged := func(r runtest.Run) {
		editRecord(t, r, func(m map[string]any) {
			m["ended_at"] = statusfile.Timestamp(time.Now().Add(-2 * time.Hour))
		})
	}
	run := func(id string, args ...string) runtest.Run {
		r := runtest.Run{Root: root, ID: id}
		cleanupRun(t, r)
		runtest.Exec(t, root, append([]string{"run", "--no-stream", id, "--"}, args...)...)
		return r
	}
	old1 := run("old-finished", "true")
	old2 := run("old-failed", "/no/such/command")
	old3 := run("old-cancelled", "sh", "-c", "kill -TERM $PPID; sleep 30")
	recent := run("recent", "sh", "-c", "exit 3")
	for _, r := range []runtest.Run{old1, old2, old3} {
		r.WaitState(t, statusfile.Finished, statusfile.LaunchFailed, statusfile.Cancelled)
		aged(r)
	}
	if s := old3.MustStatus(t).State; s != statusfile.Cancelled {
		t.Fatalf("old-cancelled is %s", s)
	}

	// A live run, and one whose wrapper and group died without a final
	// record; both with an old ended_at planted in their records.
	live := runtest.Run{Root: root, ID: "live"}
	cleanupRun(t, live)
	if code, _, errOut := runtest.Exec(t, root, "run", "--detach", "live", "--", "sleep", "300"); code != 0 {
		t.Fatalf("run --detach: %d\n%s", code, errOut)
	}
	c, lost := startRun(t, root, "lost", "lost", "--", "sleep", "300")
	cleanupRun(t, lost)
	rec := lost.WaitState(t, statusfile.Running)
	killWrapper(t, c, rec)
	if err := unix.Kill(-rec.PGID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the lost run's group to die", func() bool { return len(runtest.Members(rec.PGID)) == 0 })
	aged(live)
	aged(lost)

	// A dry run removes nothing.
	code, out, _ := runtest.Exec(t, root, "gc", "--older-than", "1h", "--dry-run")
	if code != 0 || strings.Count(out, "would remove ") != 3 {
		t.Fatalf("gc --dry-run: exit %d\n%s", code, out)
	}
	for _, r := range []runtest.Run{old1, old2, old3} {
		if r.Status() == nil {
			t.Fatalf("gc --dry-run removed %s", r.ID)
		}
	}

	code, out, errOut := runtest.Exec(t, root, "gc", "--older-than", "1h")
	if code != 0 {
		t.Fatalf("gc: exit %d\n%s%s", code, out, errOut)
	}
	for _, r := range []runtest.Run{old1, old2, old3} {
		if !strings.Contains(out, "removed "+r.ID+" (") {
			t.Errorf("gc output does not name %s:\n%s", r.ID, out)
		}
		if _, err := os.Stat(r.Dir()); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", r.ID, err)
		}
	}
	for _, r := range []runtest.Run{recent, live, lost} {
		if strings.Contains(out, r.ID) {
			t.Errorf("gc claims to have removed %s:\n%s", r.ID, out)
		}
		if r.Status() == nil {
			t.Errorf("gc removed %s", r.ID)
		}
	}
	if !strings.Contains(errOut, "kept lost: outcome unknown") {
		t.Errorf("gc does not say it kept the unknown run:\n%s", errOut)
	}
	if rec := live.MustStatus(t); !proc.Alive(rec.PID, 0) {
		t.Errorf("gc disturbed the live run")
	}
	// The recent run goes once it is old enough.
	code, out, _ = runtest.Exec(t, root, "gc", "--older-than", "0s")
	if code != 0 || !strings.Contains(out, "removed recent (finished, exit 3,") {
		t.Errorf("gc --older-than 0s: exit %d\n%s", code, out)
	}
}
