package wrapper

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// subreaperEnv marks the test binary re-run as a child subreaper, where the
// reaper's tests run: the reaper waits on every child of its process
// (waitid P_ALL) and orphans are reparented to it, which must not happen to
// the test process that runs the package's other tests.
const subreaperEnv = "AGENT_WRAP_TEST_REAPER_SUBREAPER"

// TestReaper runs the reaper against real jobs, in a process that is a child
// subreaper as a wrapper is: a leader that exits with N, or is killed by
// signal N, is decoded once, as N or exitcode.Signal(N), whether its exit
// is first seen by pollLeader (its zombie then held until reapAll) or by
// reapAll itself; a grandchild reparented to the subreaper is reaped and
// never taken for the leader; a child whose launch failed is reaped at once.
func TestReaper(t *testing.T) {
	if os.Getenv(subreaperEnv) == "" {
		runSubreaper(t, "TestReaper")
		return
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(os.NewSyscallError("prctl(PR_SET_CHILD_SUBREAPER)", err))
	}
	t.Run("exit", testReaperExit)
	t.Run("orphan", testReaperOrphan)
	t.Run("held", testReaperHeld)
	t.Run("discard", testReaperDiscard)
}

// runSubreaper re-runs the test binary for test alone, as a child
// subreaper, and fails if any of it fails.
func runSubreaper(t *testing.T, test string) {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), subreaperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+test+" ") {
		t.Fatalf("%s as a child subreaper: %v\n%s", test, err, out)
	}
}

// leaderCases are the ends the reaper decodes: exits with a code, and
// deaths by a signal the job sends itself or is sent.
var leaderCases = []struct {
	name   string
	script string
	want   leaderExit
}{
	{"code0", "exit 0", leaderExit{Code: 0}},
	{"code7", "exit 7", leaderExit{Code: 7}},
	{"TERM", "kill -TERM $$", leaderExit{Code: exitcode.Signal(int(unix.SIGTERM)), Signal: unix.SIGTERM}},
	{"KILL", "kill -KILL $$", leaderExit{Code: exitcode.Signal(int(unix.SIGKILL)), Signal: unix.SIGKILL}},
}

// The leader's exit, first seen by pollLeader, is decoded then and only
// then: later polls say nothing new and ask the kernel nothing (after
// reapAll a waitid would fail with ECHILD), and reapAll keeps it. Until
// reapAll the leader stays a zombie; after it, it is gone.
func testReaperExit(t *testing.T) {
	for _, tc := range leaderCases {
		t.Run(tc.name, func(t *testing.T) {
			r := startLeader(t, tc.script, nil)
			var firsts int
			runtest.Eventually(t, "the leader's exit", func() bool {
				first, err := r.pollLeader()
				if err != nil {
					t.Fatalf("pollLeader: %v", err)
				}
				if first {
					firsts++
				}
				return r.exited
			})
			for range 3 {
				if first, err := r.pollLeader(); first || err != nil {
					t.Fatalf("pollLeader again: first %v, %v", first, err)
				}
			}
			if firsts != 1 || r.exit != tc.want {
				t.Fatalf("seen first %d times, exit %+v; want once, %+v", firsts, r.exit, tc.want)
			}
			if st, err := proc.ReadStat(r.leader); err != nil || !st.Dead() {
				t.Fatalf("before reapAll the leader is %+v, %v; want its zombie, held", st, err)
			}
			r.reapAll()
			if first, err := r.pollLeader(); first || err != nil || r.exit != tc.want {
				t.Fatalf("after reapAll: first %v, %v, exit %+v; want %+v", first, err, r.exit, tc.want)
			}
			assertReaped(t, r.leader)
		})
	}
}

// A grandchild of the job, reparented to the subreaper when its parent
// exits, is reaped by reapOthers while the leader runs, and is never taken
// for the leader: the leader's exit, later, is its own.
func testReaperOrphan(t *testing.T) {
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer wr.Close()
	r := startLeader(t, `sh -c '(exit 9) &'; read x; exit 4`, rd)
	rd.Close()
	orphan := zombieOrphans(t, r.leader, 1)[0]
	r.reapOthers()
	assertReaped(t, orphan)
	if first, err := r.pollLeader(); first || err != nil || r.exited {
		t.Fatalf("after the orphan is reaped: first %v, %v, exited %v; want the leader still running", first, err, r.exited)
	}
	wr.Close() // the leader's read returns
	runtest.Eventually(t, "the leader's exit", func() bool {
		_, err := r.pollLeader()
		return err == nil && r.exited
	})
	if want := (leaderExit{Code: 4}); r.exit != want {
		t.Fatalf("leader's exit %+v, want %+v", r.exit, want)
	}
	r.reapAll()
	assertReaped(t, r.leader)
}

// A leader whose exit is first seen by reapAll (it died after the last
// poll) is decoded there, the same way; reapZombie, which the /proc scan
// calls for every dead child, leaves the leader's zombie alone but reaps an
// orphan's; and reapAll, with the leader's zombie and an orphan's both
// waiting, takes the leader's exit and not the orphan's.
func testReaperHeld(t *testing.T) {
	for _, tc := range leaderCases {
		t.Run(tc.name, func(t *testing.T) {
			r := startLeader(t, tc.script, nil)
			waitDead(t, r.leader)
			r.reapZombie(r.leader)
			if st, err := proc.ReadStat(r.leader); err != nil || !st.Dead() {
				t.Fatalf("after reapZombie(leader) the leader is %+v, %v; want its zombie, held", st, err)
			}
			r.reapAll()
			if !r.exited || r.exit != tc.want {
				t.Fatalf("reapAll: exited %v, exit %+v; want %+v", r.exited, r.exit, tc.want)
			}
			assertReaped(t, r.leader)
		})
	}
	t.Run("orphan", func(t *testing.T) {
		r := startLeader(t, `sh -c '(exit 9) &'; sh -c '(exit 8) &'; exit 4`, nil)
		orphans := zombieOrphans(t, r.leader, 2)
		waitDead(t, r.leader)
		r.reapZombie(orphans[0])
		assertReaped(t, orphans[0])
		r.reapAll()
		if want := (leaderExit{Code: 4}); !r.exited || r.exit != want {
			t.Fatalf("reapAll: exited %v, exit %+v; want %+v", r.exited, r.exit, want)
		}
		assertReaped(t, r.leader)
		assertReaped(t, orphans[1])
		if _, _, _, err := waitExited(unix.P_ALL, 0); !errors.Is(err, unix.ECHILD) {
			t.Fatalf("after reapAll, waitid: %v; want ECHILD (no children left)", err)
		}
	})
}

// A child killed because its launch failed is reaped by discard, which
// waits for it: no zombie is left.
func testReaperDiscard(t *testing.T) {
	var r reaper
	pid := startChild(t, "exec sleep 600", nil)
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r.discard(pid)
	assertReaped(t, pid)
	if r.exited || r.exit != (leaderExit{}) {
		t.Fatalf("discard changed the leader's exit: %v %+v", r.exited, r.exit)
	}
}

// startLeader starts sh -c script as launch starts a job (a session of its
// own, stdin from stdin or /dev/null) and returns a reaper for it.
func startLeader(t *testing.T, script string, stdin *os.File) *reaper {
	return &reaper{leader: startChild(t, script, stdin)}
}

// startChild forks sh -c script in a session of its own. When the test
// ends what is left of its group is KILLed, and it is reaped if the test
// has not done so.
func startChild(t *testing.T, script string, stdin *os.File) int {
	t.Helper()
	if stdin == nil {
		null, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer null.Close()
		stdin = null
	}
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{
		Files: []uintptr{stdin.Fd(), os.Stderr.Fd(), os.Stderr.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := proc.ReadStat(pid) // it is unreaped: this holds even if it has exited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Its group by identity (the test may have reaped it, and its
		// number be another's by now), then itself, unless reaped.
		runtest.KillGroup(pid, st.Start)
		_ = reap(pid, true)
	})
	return pid
}

// zombieOrphans waits for n children of this process, other than leader,
// that have exited: orphans of leader's job, reparented to us.
func zombieOrphans(t *testing.T, leader, n int) []int {
	t.Helper()
	var found []int
	runtest.Eventually(t, "orphans' zombies, reparented to the subreaper", func() bool {
		all, err := proc.Scan()
		if err != nil {
			t.Fatal(err)
		}
		found = found[:0]
		for _, p := range all {
			if p.PPID == os.Getpid() && p.PID != leader && p.Dead() {
				found = append(found, p.PID)
			}
		}
		return len(found) == n
	})
	return found
}

// waitDead waits until pid, a child of ours, has exited (a zombie).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	runtest.Eventually(t, "the leader's zombie", func() bool {
		st, err := proc.ReadStat(pid)
		if err != nil {
			t.Fatalf("the leader is gone before it was reaped: %v", err)
		}
		return st.Dead()
	})
}

// assertReaped checks that pid is no longer a child of ours, zombie or not.
func assertReaped(t *testing.T, pid int) {
	t.Helper()
	if _, _, _, err := waitExited(unix.P_PID, pid); !errors.Is(err, unix.ECHILD) {
		t.Fatalf("waitid(%d): %v; want ECHILD (reaped)", pid, err)
	}
}
