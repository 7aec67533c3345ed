package stop_test

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// job starts script under sh in a session of its own and returns the
// record a wrapper would have written for it. The group is killed when the
// test ends.
func job(t *testing.T, script string) *statusfile.Record {
	t.Helper()
	st := runtest.Spawn(t, nil, "sh", "-c", script)
	pid := st.PID
	boot, _ := proc.BootID()
	return &statusfile.Record{RunID: "loop-1", PID: pid, PGID: pid, SID: pid, LeaderStart: st.Start, BootID: boot}
}

// sent records what a Loop signalled, and signals it.
type sent struct {
	mu   sync.Mutex
	sigs []unix.Signal
}

func (s *sent) signal(t *testing.T) func(unix.Signal, []membership.Member, bool) {
	return func(sig unix.Signal, ms []membership.Member, again bool) {
		s.mu.Lock()
		s.sigs = append(s.sigs, sig)
		s.mu.Unlock()
		for _, m := range ms {
			if err := stop.Signal(m.Identity, sig); err != nil {
				t.Logf("signal %v to %d: %v", sig, m.PID, err)
			}
		}
	}
}

func members(t *testing.T, rec *statusfile.Record) func() []membership.Member {
	return func() []membership.Member {
		ms, _, err := membership.Run{Record: rec}.Members()
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
}

// waitMembers waits until the job has n live members.
func waitMembers(t *testing.T, rec *statusfile.Record, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(members(t, rec)()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the job never had %d members", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A job that ignores TERM is KILLed once the grace has passed, and nothing
// survives.
func TestLoopKillsWhatIgnoresTerm(t *testing.T) {
	rec := job(t, `trap "" TERM; sleep 600 & wait; wait`)
	waitMembers(t, rec, 2)
	var s sent
	loop := stop.Loop{Members: members(t, rec), Signal: s.signal(t), Wake: stop.PollWake}
	start := time.Now()
	res := loop.Run(300 * time.Millisecond)
	if len(res.Stopped) != 2 || len(res.Survivors) != 0 || !res.Proven {
		t.Fatalf("%+v; want 2 stopped, none surviving, proven", res)
	}
	if len(s.sigs) < 2 || s.sigs[0] != unix.SIGTERM || s.sigs[len(s.sigs)-1] != unix.SIGKILL {
		t.Fatalf("signals sent: %v, want TERM then KILL", s.sigs)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatalf("KILL came before the grace had passed (%v)", time.Since(start))
	}
}

// A member born during the grace (the leader's TERM trap starts it and
// exits once it has exec'd sleep: a TERM that reaches the forked shell
// before the exec is caught by the shell's trap and lost, and then only
// KILL would end it) gets a TERM of its own when it is found, so it ends
// within the grace: no KILL is sent.
func TestLoopTermsLateArrivals(t *testing.T) {
	rec := job(t, `trap 'sleep 600 & while [ "$(cat /proc/$!/comm 2>/dev/null)" != sleep ]; do :; done; exit 0' TERM
while :; do sleep 0.05; done`)
	waitMembers(t, rec, 2)
	var s sent
	loop := stop.Loop{Members: members(t, rec), Signal: s.signal(t), Wake: stop.PollWake}
	start := time.Now()
	res := loop.Run(time.Minute)
	if len(res.Survivors) != 0 {
		t.Fatalf("survivors %v", res.Survivors)
	}
	for _, sig := range s.sigs {
		if sig == unix.SIGKILL {
			t.Fatalf("signals sent: %v: the late member was KILLed, not TERMed within the grace", s.sigs)
		}
	}
	if len(s.sigs) < 2 {
		t.Fatalf("signals sent: %v, want a TERM for the late member too", s.sigs)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the stop took %v: it waited for the grace", d)
	}
}

// The proof phase: a member found after the grace is frozen and then
// KILLed; Sweep is called once, when the grace ends; and the stop is
// proven only after two looks in a row that found nothing, each confirmed
// by Empty (here, Empty disagrees three times first, as a cgroup that is
// still populated would).
func TestLoopProofNeedsEmptyTwice(t *testing.T) {
	rec := job(t, `trap "" TERM; sleep 600 & wait; wait`)
	waitMembers(t, rec, 2)
	var s sent
	sweeps, asked, agreed := 0, 0, 0
	loop := stop.Loop{Members: members(t, rec), Signal: s.signal(t), Wake: stop.PollWake,
		Sweep: func() { sweeps++ },
		Empty: func() bool {
			asked++
			if asked <= 3 {
				return false
			}
			agreed++
			return true
		}}
	res := loop.Run(100 * time.Millisecond)
	if !res.Proven || len(res.Survivors) != 0 || len(res.Stopped) != 2 {
		t.Fatalf("%+v; want 2 stopped, none surviving, proven", res)
	}
	if sweeps != 1 || agreed != 2 {
		t.Fatalf("Sweep called %d times, Empty agreed %d times (asked %d); want 1 and 2", sweeps, agreed, asked)
	}
	var stopAt, killAt = -1, -1
	for i, sig := range s.sigs {
		if sig == unix.SIGSTOP && stopAt < 0 {
			stopAt = i
		}
		if sig == unix.SIGKILL && killAt < 0 {
			killAt = i
		}
	}
	if stopAt < 0 || killAt < stopAt {
		t.Fatalf("signals sent: %v; want STOP before KILL", s.sigs)
	}
}

// A stop that never sees the caller's proof is not proven, whatever the
// looks say, and it gives up after its bound.
func TestLoopUnprovenWithoutEmpty(t *testing.T) {
	rec := job(t, `sleep 600`)
	waitMembers(t, rec, 1)
	var s sent
	loop := stop.Loop{Members: members(t, rec), Signal: s.signal(t), Wake: stop.PollWake,
		Empty: func() bool { return false }}
	res := loop.Run(100 * time.Millisecond)
	if res.Proven || len(res.Survivors) != 0 {
		t.Fatalf("%+v; want not proven, no survivor seen", res)
	}
}

// A stop whose TERM ends every member within the grace, with the caller's
// proof agreeing, ends there: no Sweep (the wrapper's cgroup.kill), no
// STOP, no KILL, and it is proven.
func TestLoopNoSweepWhenTermEndsAll(t *testing.T) {
	rec := job(t, `sleep 600 & wait`)
	waitMembers(t, rec, 2)
	var s sent
	sweeps, asked := 0, 0
	loop := stop.Loop{Members: members(t, rec), Signal: s.signal(t), Wake: stop.PollWake,
		Sweep: func() { sweeps++ },
		Empty: func() bool { asked++; return true }}
	res := loop.Run(time.Minute)
	if !res.Proven || len(res.Survivors) != 0 || len(res.Stopped) != 2 {
		t.Fatalf("%+v; want 2 stopped, none surviving, proven", res)
	}
	if sweeps != 0 {
		t.Fatalf("Sweep called %d times; want none: TERM ended everything", sweeps)
	}
	for _, sig := range s.sigs {
		if sig != unix.SIGTERM {
			t.Fatalf("signals sent: %v; want only TERM", s.sigs)
		}
	}
	if asked < 2 {
		t.Fatalf("Empty asked %d times; want at least the proof's two looks", asked)
	}
}

// When TERM ends every member the looks can see but the caller's proof
// disagrees (a process no look finds, as in a cgroup below the run's), the
// sweep still comes, once, right after the grace.
func TestLoopSweepsWhenEmptyDisagrees(t *testing.T) {
	rec := job(t, `sleep 600 & wait`)
	waitMembers(t, rec, 2)
	var s sent
	sweeps, asked := 0, 0
	loop := stop.Loop{Members: members(t, rec), Signal: s.signal(t), Wake: stop.PollWake,
		Sweep: func() { sweeps++ },
		Empty: func() bool { asked++; return asked > 1 }}
	res := loop.Run(time.Minute)
	if !res.Proven || len(res.Survivors) != 0 {
		t.Fatalf("%+v; want none surviving, proven", res)
	}
	if sweeps != 1 {
		t.Fatalf("Sweep called %d times; want 1", sweeps)
	}
}
