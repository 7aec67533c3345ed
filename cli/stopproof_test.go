//go:build linux

package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// walkerLife bounds a walking job's life: far beyond any stop, short
// enough that a failed test does not leave it running long.
const walkerLife = 90 * time.Second

// host is where a test runs agent-wrap: as root, whose runs get their own
// cgroup, or as a second user, whose runs cannot (the cgroup tree is
// root's) and fall back to the session and the wrapper's subreaper tree.
type host struct {
	name string
	user *runtest.User // nil: root
	root string
}

func newHost(t *testing.T, cgroup bool) *host {
	t.Helper()
	if cgroup {
		needCgroup(t)
		return &host{name: "cgroup", root: runtest.NewRoot(t)}
	}
	u := runtest.SecondUser(t)
	return &host{name: "no-cgroup", user: u, root: u.Root(t)}
}

func (h *host) setup(c *exec.Cmd) {
	if h.user != nil {
		h.user.As(c)
	}
}

func (h *host) uid() int {
	if h.user == nil {
		return -1
	}
	return h.user.UID
}

// start runs args under `agent-wrap run` on the host.
func (h *host) start(t *testing.T, id string, args ...string) (*runtest.Cmd, runtest.Run) {
	t.Helper()
	r := runtest.Run{Root: h.root, ID: id}
	t.Cleanup(r.Kill)
	return runtest.StartWith(t, h.root, h.setup, append([]string{"run"}, args...)...), r
}

// aw runs one agent-wrap command on the host and returns its exit code,
// stdout and stderr.
func (h *host) aw(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	c := runtest.StartWith(t, h.root, h.setup, args...)
	code := c.Wait(t)
	return code, c.Stdout.String(), c.Stderr.String()
}

// wantContainment is what a run's final record must vouch for on the host
// when the wrapper ended it: its cgroup, or as root without one, the
// subreaper's empty tree.
func (h *host) wantContainment() string {
	if h.user == nil {
		return statusfile.ContainmentCgroup
	}
	return statusfile.ContainmentSubreaper
}

// assertProven checks a final record that says nothing survived, and the
// proof it names.
func assertProven(t *testing.T, r runtest.Run, rec *statusfile.Record, state, containment string) {
	t.Helper()
	if rec.State != state || rec.Containment != containment || rec.Survivors == nil || len(rec.Survivors) != 0 {
		t.Fatalf("final record: state %s containment %q survivors %#v; want %s, %s, []%s", rec.State, rec.Containment, rec.Survivors, state, containment, diag(r))
	}
}

// diag is the run's record and the end of its journal, for a failure
// message.
func diag(r runtest.Run) string {
	lines := strings.Split(strings.TrimSpace(r.File("events.jsonl")), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "\nstatus.json:\n" + r.File("status.json") + "journal (last lines):\n" + strings.Join(lines, "\n")
}

// A job whose processes keep forking a child that calls setsid and then
// exiting (and ignore TERM) is stopped whole, with and without a cgroup,
// whichever way the run ends: every process it made is dead when the
// final record is written, and the record names the proof. Before, one
// empty look ended the stop while the walker lived on.
func TestWalkingJobStopped(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	for _, cg := range []bool{true, false} {
		for _, end := range []string{"cancel", "lease", "leader-walks"} {
			name := end + "/cgroup"
			if !cg {
				name = end + "/no-cgroup"
			}
			t.Run(name, func(t *testing.T) {
				h := newHost(t, cg)
				mode := "children"
				if end == "leader-walks" {
					mode = "leader"
				}
				w := runtest.NewWalker(t, mode, walkerLife, h.uid())
				c, r := h.start(t, "walk", append([]string{"--lease", "5m", "--grace", "1s", "walk", "--"}, w.Argv...)...)
				if mode == "children" {
					r.WaitState(t, statusfile.Running)
					w.WaitWalking(t, 50)
				}
				switch end {
				case "cancel":
					if code, out, stderr := h.aw(t, "cancel", "walk"); code != 0 {
						t.Fatalf("cancel: exit %d\n%s%s%s", code, out, stderr, diag(r))
					}
				case "lease":
					if code, _, stderr := h.aw(t, "renew", "--lease", "1s", "walk"); code != 0 {
						t.Fatalf("renew --lease 1s: exit %d: %s", code, stderr)
					}
				}
				code := c.Wait(t)
				if live := w.Alive(); len(live) > 0 {
					t.Errorf("walkers alive after the run ended: %v%s", live, diag(r))
				}
				w.AssertAllDead(t)
				rec := r.MustStatus(t)
				want := map[string]struct {
					state string
					code  int
				}{"cancel": {statusfile.Cancelled, 143}, "lease": {statusfile.Cancelled, 124}, "leader-walks": {statusfile.Finished, 0}}[end]
				if code != want.code {
					t.Fatalf("run: exit %d, want %d\n%s%s", code, want.code, c.Stderr.String(), diag(r))
				}
				assertProven(t, r, rec, want.state, h.wantContainment())
				t.Logf("the walker made %d processes; journal: %d lines", len(w.Made()), len(r.Journal(t)))
				if rc, out, _ := h.aw(t, "reconcile", "--json", "walk"); rc != 0 {
					t.Fatalf("reconcile: exit %d: %s", rc, out)
				}
			})
		}
	}
}

// The wrapper SIGKILLed while a walking job runs, and its lease ended: the
// watchdog's stop from outside ends the walker through the run's cgroup
// (cgroup.kill, then the cgroup seen unpopulated) and says so. Without a
// cgroup the walkers left the session unrecorded, and their parents are
// gone: the stop finds them by the run's logs they hold and ends them all,
// going on until the kernel says no process has the logs open for
// writing; still, a process that gave up the logs could not have been
// seen, so the record says containment session, survivors unknown, and
// reconcile says unknown, not cancelled.
func TestWalkingJobWatchdogAfterWrapperKilled(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	for _, cg := range []bool{true, false} {
		name := "cgroup"
		if !cg {
			name = "no-cgroup"
		}
		t.Run(name, func(t *testing.T) {
			h := newHost(t, cg)
			w := runtest.NewWalker(t, "children", walkerLife, h.uid())
			c, r := h.start(t, "walk", append([]string{"--lease", "5m", "--grace", "1s", "walk", "--"}, w.Argv...)...)
			rec := r.WaitState(t, statusfile.Running)
			w.WaitWalking(t, 50)
			if err := stop.Signal(proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			c.Wait(t)
			if code, _, stderr := h.aw(t, "renew", "--lease", "1s", "walk"); code != 1 {
				// renew refuses nothing here: the run is still `running`.
				if code != 0 {
					t.Fatalf("renew --lease 1s: exit %d: %s", code, stderr)
				}
			}
			dl := time.Unix(deadlineOf(t, r), 0)
			runtest.Eventually(t, "the deadline to pass", func() bool { return time.Now().After(dl) })
			if code, out, stderr := h.aw(t, "watchdog", "--once"); code != 0 || !strings.Contains(out, `"stopped"`) {
				t.Fatalf("watchdog: exit %d: %s%s", code, out, stderr)
			}
			final := r.MustStatus(t)
			code, v := verdictOn(t, h, "walk")
			if cg {
				w.AssertAllDead(t)
				assertProven(t, r, final, statusfile.Cancelled, statusfile.ContainmentCgroup)
				if code != 0 || v.Outcome != reconcile.Cancelled {
					t.Fatalf("reconcile: exit %d outcome %s: %s", code, v.Outcome, v.Reason)
				}
				return
			}
			w.AssertAllDead(t)
			if final.State != statusfile.Cancelled || final.Containment != statusfile.ContainmentSession || final.Survivors != nil {
				t.Fatalf("final record: state %s containment %q survivors %#v; want cancelled, session, unknown", final.State, final.Containment, final.Survivors)
			}
			if !strings.Contains(r.File("status.json"), `"survivors": null`) {
				t.Fatalf("status.json does not say survivors null:\n%s", r.File("status.json"))
			}
			if code != 4 || v.Outcome != reconcile.Unknown || !strings.Contains(v.Reason, "cannot be seen") {
				t.Fatalf("reconcile: exit %d outcome %s: %s; want 4, unknown, saying escapes cannot be seen", code, v.Outcome, v.Reason)
			}
		})
	}
}

// verdictOn is reconcile --json of one run on the host.
func verdictOn(t *testing.T, h *host, id string) (int, reconcile.Verdict) {
	t.Helper()
	code, out, stderr := h.aw(t, "reconcile", "--json", id)
	var v reconcile.Verdict
	m := runtest.JSON(t, out)
	v.Outcome, _ = m["outcome"].(string)
	v.Reason, _ = m["reason"].(string)
	if v.Outcome == "" {
		t.Fatalf("reconcile: exit %d: %s%s", code, out, stderr)
	}
	return code, v
}

// Without a cgroup, a stop from outside the wrapper (cancel, the
// watchdog) sees the job's session, the escapes the wrapper recorded, what
// they forked, and the processes that hold the run's logs as their fds 1
// and 2 (the job's own descendants, wherever they went). A process that
// left the session after the wrapper died, whose parent then exited, is
// found by its logs if it kept them, and is stopped; one that also gave
// them up is invisible: either way the final record must not say that
// nothing survived (containment session, survivors null), reconcile says
// unknown (exit 4) and why, and cancel exits 1 saying cleanup cannot be
// confirmed. Before, the record said survivors [] and reconcile
// `cancelled` while the escapee lived.
func TestOutsideStopWithoutCgroupClaimsNothing(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	for _, tc := range []struct {
		by        string
		keepsLogs bool
	}{{"cancel", false}, {"watchdog", false}, {"cancel", true}, {"watchdog", true}} {
		name := tc.by + "/escapee-without-logs"
		if tc.keepsLogs {
			name = tc.by + "/escapee-with-logs"
		}
		t.Run(name, func(t *testing.T) {
			by := tc.by
			h := newHost(t, false)
			dir, err := os.MkdirTemp("", "aw-escape-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			os.Chmod(dir, 0o755)
			goFile := filepath.Join(dir, "go")
			// The job leaves its session (setsid) only once the test says
			// so, after its wrapper is dead: no wrapper ever sees it, and
			// its parent exits at once, so no parent links it to the run.
			escape := "setsid sleep 7101 </dev/null >/dev/null 2>&1 &"
			if tc.keepsLogs {
				escape = "setsid sleep 7101 &"
			}
			job := "while [ ! -e " + goFile + " ]; do sleep 0.05; done; sh -c '" + escape + "'; sleep 7100"
			c, r := h.start(t, "esc", "--lease", "5m", "--grace", "1s", "esc", "--", "sh", "-c", job)
			rec := r.WaitState(t, statusfile.Running)
			if err := stop.Signal(proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			c.Wait(t)
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			var esc proc.Stat
			runtest.Eventually(t, "the job's escape into a session of its own", func() bool {
				all, _ := proc.Scan()
				for _, p := range all {
					argv, _ := proc.Cmdline(p.PID)
					if p.SID == p.PID && p.Start >= rec.LeaderStart && strings.Join(argv, " ") == "sleep 7101" {
						esc = p
						return true
					}
				}
				return false
			})
			t.Cleanup(func() { stop.Signal(proc.Identity{PID: esc.PID, Start: esc.Start}, unix.SIGKILL) })
			switch by {
			case "cancel":
				code, out, stderr := h.aw(t, "cancel", "esc")
				if code != 1 || !strings.Contains(stderr, "cannot be confirmed") || !strings.Contains(out, "survivors unknown") {
					t.Fatalf("cancel: exit %d\nstdout: %s\nstderr: %s\nwant exit 1, survivors unknown, cleanup cannot be confirmed", code, out, stderr)
				}
			case "watchdog":
				if code, _, stderr := h.aw(t, "renew", "--lease", "1s", "esc"); code != 0 {
					t.Fatalf("renew --lease 1s: exit %d: %s", code, stderr)
				}
				dl := time.Unix(deadlineOf(t, r), 0)
				runtest.Eventually(t, "the deadline to pass", func() bool { return time.Now().After(dl) })
				if code, out, stderr := h.aw(t, "watchdog", "--once"); code != 0 || !strings.Contains(out, `"stopped"`) {
					t.Fatalf("watchdog: exit %d: %s%s", code, out, stderr)
				}
			}
			switch {
			case tc.keepsLogs && !runtest.Within(10*time.Second, func() bool { return !proc.Alive(esc.PID, esc.Start) }):
				t.Fatalf("the escapee %d, holding the run's logs, outlived the stop", esc.PID)
			case !tc.keepsLogs && !proc.Alive(esc.PID, esc.Start):
				t.Fatalf("the escapee %d, which gave up the run's logs, died: the test shows nothing", esc.PID)
			}
			if live := runtest.GroupOf(rec.PGID, rec.LeaderStart); len(live) > 0 {
				t.Fatalf("the job's group outlived the stop: %+v", live)
			}
			final := r.MustStatus(t)
			if final.State != statusfile.Cancelled || final.Containment != statusfile.ContainmentSession || final.Survivors != nil {
				t.Fatalf("final record: state %s containment %q survivors %#v; want cancelled, session, unknown", final.State, final.Containment, final.Survivors)
			}
			if s := r.File("status.json"); !strings.Contains(s, `"survivors": null`) {
				t.Fatalf("status.json claims to know the survivors:\n%s", s)
			}
			code, v := verdictOn(t, h, "esc")
			if code != 4 || v.Outcome != reconcile.Unknown || !strings.Contains(v.Reason, "cannot be seen") {
				t.Fatalf("reconcile: exit %d outcome %s: %s; want 4, unknown, saying escapes cannot be seen", code, v.Outcome, v.Reason)
			}
			// A second cancel changes nothing and still cannot confirm.
			if code, _, stderr := h.aw(t, "cancel", "esc"); code != 1 || !strings.Contains(stderr, "cannot be confirmed") {
				t.Fatalf("cancel of the cancelled run: exit %d: %s", code, stderr)
			}
		})
	}
}
