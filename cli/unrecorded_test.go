//go:build linux

package cli_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// A cancel that lands while the wrapper is starting the job, the wrapper
// stopped (by strace, at the creation of the pid file: after the fork,
// before the job is recorded) and then killed or left stopped: the record
// says `cancelling` and names no process group. Nothing may then record
// the run stopped while its job lives. reconcile sees the job; the cancel
// that finishes the stop adopts it (from the run's cgroup, or without one
// from the process whose stdout is the run's stdout.log) and stops its
// whole group; with the wrapper still stopped, the watchdog takes the job
// from the wrapper's children.
func TestCancelWhileStartingStopsTheUnrecordedJob(t *testing.T) {
	t.Parallel() // waits on graces, not the CPU
	for _, tc := range []struct {
		name, cgroup string
		kill         bool
		code         int // of the cancel that finishes the stop
	}{
		{"cgroup/wrapper-killed", "auto", true, 0},
		// Without a cgroup the cleanup is unconfirmed (exit 1): nothing
		// that left the session unrecorded could have been seen.
		{"no-cgroup/wrapper-killed", "off", true, 1},
		{"no-cgroup/wrapper-stopped", "off", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := runtest.NewRoot(t)
			r := runtest.Run{Root: root, ID: "unrec"}
			s := underStrace(t, root, stopAt("openat", false, "pid"),
				"run", "--cgroup", tc.cgroup, "--lease", "5m", "--grace", "1s", "--no-stream", r.ID, "--", "sh", "-c", "sleep 300 & wait")
			var wrapper, job proc.Stat
			runtest.Eventually(t, "the wrapper stopped after starting the job, before recording it", func() bool {
				rec, err := r.ReadStatus()
				if err != nil || rec.State != statusfile.Starting {
					return false
				}
				w, err := proc.ReadStat(rec.WrapperPID)
				if err != nil || (w.State != 't' && w.State != 'T') {
					return false
				}
				all, _ := proc.Scan()
				for _, p := range all {
					if p.PPID == w.PID && p.SID == p.PID && len(runtest.GroupOf(p.PID, p.Start)) == 2 {
						wrapper, job = w, p
						return true
					}
				}
				return false
			})
			s.proc = wrapper
			if rec := r.MustStatus(t); rec.PGID != 0 {
				t.Fatalf("the stopped wrapper recorded group %d: the test needs the job unrecorded", rec.PGID)
			}
			if code, out, errOut := aw(t, root, "cancel", "--wait", "1s", r.ID); code != 1 {
				t.Fatalf("cancel of a run whose wrapper is stopped: exit %d, want 1 (not confirmed)\n%s%s", code, out, errOut)
			}
			if rec := r.MustStatus(t); rec.State != statusfile.Cancelling || rec.PGID != 0 {
				t.Fatalf("after the unconfirmed cancel: state %s, group %d; want cancelling, no group", rec.State, rec.PGID)
			}
			if tc.kill {
				if err := unix.Kill(wrapper.PID, unix.SIGKILL); err != nil {
					t.Fatal(err)
				}
				// strace lives on: it traces the job too (-f).
				runtest.Eventually(t, "the killed wrapper to be gone", func() bool { return !proc.Alive(wrapper.PID, wrapper.Start) })
			}
			code, out, _ := aw(t, root, "reconcile", r.ID)
			if code != 3 || !strings.Contains(out, strconv.Itoa(job.PID)) && tc.kill {
				t.Fatalf("reconcile with the job alive: exit %d, want 3 (running) naming pid %d\n%s", code, job.PID, out)
			}
			if tc.kill {
				code, out, errOut := aw(t, root, "cancel", "--wait", "10s", r.ID)
				if code != tc.code {
					t.Errorf("the cancel that finishes the stop: exit %d, want %d\n%s%s", code, tc.code, out, errOut)
				}
			} else {
				runtest.Start(t, root, "watchdog", "--interval", "1s")
			}
			final := r.WaitState(t, statusfile.Cancelled)
			if !runtest.Within(10*time.Second, func() bool { return len(runtest.GroupOf(job.PID, job.Start)) == 0 }) {
				t.Fatalf("the job's group %d outlived its run's final record %+v: %v", job.PID, final, runtest.GroupOf(job.PID, job.Start))
			}
			if final.Cause != statusfile.CauseCancel || final.PGID != job.PID {
				t.Errorf("final record: cause %s, group %d; want cancel, the adopted job %d", final.Cause, final.PGID, job.PID)
			}
			if count(r.Journal(t), "adopted") != 1 {
				t.Errorf("no adopted line in the journal: %v", r.Events(t))
			}
			if !tc.kill {
				if code := s.resume(t); code != 143 {
					t.Errorf("the resumed wrapper: exit %d, want 143 (the record's)\n%s", code, s.out.String())
				}
			}
		})
	}
}
