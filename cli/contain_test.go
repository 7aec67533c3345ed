//go:build linux

package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// escapingJob starts `setsid sleep 300 &` and a double-forked daemon (fork,
// setsid, fork: the middle process exits, the daemon is orphaned into a new
// session), then runs body.
func escapingJob(body string) []string {
	return []string{"sh", "-c",
		"setsid sleep 301 & (setsid sh -c 'sleep 302 & exit 0' &); " + body}
}

// waitEscapes waits until both escapes are journaled and recorded.
func waitEscapes(t *testing.T, r runtest.Run) []statusfile.Escaped {
	t.Helper()
	var esc []statusfile.Escaped
	ok := runtest.Within(runtest.Patience, func() bool {
		rec := r.Status()
		if rec == nil {
			return false
		}
		esc = rec.Escaped
		n := 0
		for _, e := range esc {
			if strings.Contains(strings.Join(e.Argv, " "), "sleep 30") {
				n++
			}
		}
		return n >= 2
	})
	if !ok {
		t.Fatalf("gave up waiting for two escaped descendants in status.json\nstatus: %s\njournal: %s\nprocesses: %s",
			r.File("status.json"), r.File("events.jsonl"), processTable())
	}
	n := 0
	for _, e := range r.Journal(t) {
		if e.Event == "escaped" {
			n++
		}
	}
	if n < 2 {
		t.Fatalf("escapes recorded but not journaled: %v", r.Events(t))
	}
	for _, e := range esc {
		if e.SID == r.PGID() && e.PGID == r.PGID() {
			t.Fatalf("recorded escape %d is in the run's own group", e.PID)
		}
	}
	return esc
}

func assertDead(t *testing.T, esc []statusfile.Escaped) {
	t.Helper()
	for _, e := range esc {
		if proc.Alive(e.PID, e.Start) {
			t.Fatalf("escaped pid %d (%v) survived", e.PID, e.Argv)
		}
	}
}

// Escapes are journaled, recorded and stopped, whichever way the run ends:
// cancel, lease expiry, or the leader exiting normally; with the run's own
// cgroup and without one (session and subreaper tree alone).
func TestEscapesStopped(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	for _, tc := range []struct {
		name string
		args []string
		body string
		end  func(t *testing.T, root string, r runtest.Run, rec *statusfile.Record)
		want string
	}{
		{"cancel", nil, "sleep 300", func(t *testing.T, root string, r runtest.Run, rec *statusfile.Record) {
			if code, out, stderr := aw(t, root, "cancel", r.ID); code != 0 {
				t.Fatalf("cancel: %d %s %s", code, out, stderr)
			}
		}, statusfile.Cancelled},
		{"lease", []string{"--lease", "5m"}, "sleep 300", func(t *testing.T, root string, r runtest.Run, rec *statusfile.Record) {
			endLease(t, root, r) // once the escapes are recorded
		}, statusfile.Cancelled},
		{"leader-exit", nil, "sleep 1; exit 0", nil, statusfile.Finished},
	} {
		for _, cg := range []string{"auto", "off"} {
			t.Run(tc.name+"/cgroup-"+cg, func(t *testing.T) {
				t.Parallel()
				root := runtest.NewRoot(t)
				args := append(append([]string{"--grace", "2s", "--cgroup", cg}, tc.args...), append([]string{tc.name, "--"}, escapingJob(tc.body)...)...)
				c, r := startRun(t, root, tc.name, args...)
				rec := r.WaitState(t, statusfile.Running)
				esc := waitEscapes(t, r)
				if tc.end != nil {
					tc.end(t, root, r, rec)
				}
				c.Wait(t)
				r.AssertGroupEmpty(t)
				assertDead(t, esc)
				if got := r.MustStatus(t).State; got != tc.want {
					t.Fatalf("state %s, want %s", got, tc.want)
				}
			})
		}
	}
}

// A tree of 500 processes (shells fanning out): cancel leaves none. The time
// it takes is logged, not asserted (see BENCHMARKS.md for timing).
func TestCancelWideTree(t *testing.T) {
	root := runtest.NewRoot(t)
	// 1 + 10 shells, each with 49 sleeps: 500 processes.
	job := `for i in 1 2 3 4 5 6 7 8 9 10; do sh -c 'for j in $(seq 49); do sleep 300 & done; wait' & done; wait`
	c, r := startRun(t, root, "wide", "wide", "--", "sh", "-c", job)
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "500 processes in the group", func() bool { return len(runtest.Members(rec.PGID)) >= 500 })
	start := time.Now()
	code, out, stderr := aw(t, root, "cancel", "wide")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, stderr)
	}
	c.Wait(t)
	r.AssertGroupEmpty(t)
	t.Logf("cancel of 500 cooperating processes confirmed in %v", took)
}

// A job that forks continuously while it is being stopped (and ignores
// TERM): nothing is left after KILL, and a canary of the same user outside
// the run is untouched.
func TestForkingJobStoppedCanaryUntouched(t *testing.T) {
	root := runtest.NewRoot(t)
	canary := exec.Command("setsid", "sleep", "300")
	if err := canary.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { canary.Process.Kill(); canary.Wait() })
	var cst proc.Stat
	runtest.Eventually(t, "the canary", func() bool {
		var err error
		cst, err = proc.ReadStat(canary.Process.Pid)
		return err == nil && cst.Comm == "sleep"
	})
	job := `trap '' TERM; i=0; while [ $i -lt 3000 ]; do sleep 300 & i=$((i+1)); done; wait`
	c, r := startRun(t, root, "forker", "--grace", "1s", "forker", "--", "sh", "-c", job)
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "the job to be forking", func() bool { return len(runtest.Members(rec.PGID)) >= 50 })
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	if code := c.Wait(t); code != 143 {
		t.Fatalf("exit %d\n%s", code, c.Stderr.String())
	}
	r.AssertGroupEmpty(t)
	if got := r.MustStatus(t).Survivors; len(got) != 0 {
		t.Fatalf("survivors %v", got)
	}
	if !proc.Alive(cst.PID, cst.Start) {
		t.Fatal("the canary outside the run was killed")
	}
}

// No zombie lingers under the wrapper after a descendant exits: orphans
// reparented to it (it is their subreaper) are reaped at once, those of the
// job's start and those it makes later, while the wrapper is idle in its
// loop.
func TestNoZombiesUnderWrapper(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	// Five orphans that exit after a moment, reparented to the wrapper; on
	// USR1, five more that live 5 s (long enough to be seen alive under the
	// wrapper on a loaded machine).
	// The job says when its trap is set (a USR1 before that would kill
	// it: the record says running from the wrapper's start, before sh has
	// read a line).
	ready := filepath.Join(t.TempDir(), "ready")
	job := `trap 'for i in 1 2 3 4 5; do (sleep 5 &); done' USR1
for i in 1 2 3 4 5; do (sleep 0.2 &); done
: > "$1"
while :; do sleep 0.1; done`
	c, r := startRun(t, root, "zombies", "zombies", "--", "sh", "-c", job, "sh", ready)
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "the job to set its trap", func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	children := func() (live, zombies []int) {
		all, _ := proc.Scan()
		for _, p := range all {
			if p.PPID == rec.WrapperPID {
				if p.Dead() {
					zombies = append(zombies, p.PID)
				} else {
					live = append(live, p.PID)
				}
			}
		}
		return
	}
	runtest.Eventually(t, "the orphans to exit and be reaped", func() bool {
		live, zombies := children()
		return len(live) == 1 && len(zombies) == 0 // only the leader
	})

	// Orphans made now, while we watch: each is seen alive under the
	// wrapper, then exits, and its zombie is gone within 2 s.
	if err := unix.Kill(rec.PID, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	runtest.Eventually(t, "five new orphans reparented to the wrapper", func() bool {
		live, _ := children()
		for _, p := range live {
			if p != rec.PID {
				seen[p] = true
			}
		}
		return len(seen) == 5
	})
	lingering := map[int]time.Time{}
	runtest.Eventually(t, "the new orphans to exit and be reaped", func() bool {
		live, zombies := children()
		now := time.Now()
		for _, z := range zombies {
			if first, ok := lingering[z]; !ok {
				lingering[z] = now
			} else if now.Sub(first) > 2*time.Second {
				t.Fatalf("zombie child %d of the wrapper lingers for %v", z, now.Sub(first))
			}
		}
		return len(live) == 1 && len(zombies) == 0
	})
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	c.Wait(t)
	r.AssertGroupEmpty(t)
}

// processTable renders /proc for a failure message.
func processTable() string {
	all, _ := proc.Scan()
	var b strings.Builder
	for _, p := range all {
		argv, _ := proc.Cmdline(p.PID)
		fmt.Fprintf(&b, "\n  pid %d ppid %d pgid %d sid %d %c %s", p.PID, p.PPID, p.PGID, p.SID, p.State, strings.Join(argv, " "))
	}
	return b.String()
}
