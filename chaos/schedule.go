// Package chaos is agent-wrap's seeded fault campaign: from one seed it
// draws a schedule of runs (the workload) and faults (the nemesis), plays
// it against the real binary on a real tmpfs, checks named invariants all
// the time and at the end, and counts which fault landed in which phase of
// a run.
//
// What it guarantees:
//   - A schedule is a pure function of its seed and Options: the same seed
//     prints the same schedule (Schedule.String), on any machine. Playing
//     it again repeats the same steps at the same offsets; what the kernel
//     does in between (timing) can differ.
//   - Every process the campaign starts is stopped when a schedule ends, by
//     recorded PID and start time or by the run's recorded cgroup, never by
//     name; the tmpfs it mounted is unmounted even when a check fails.
//   - A violation names its checker, the run, and the evidence seen (PIDs,
//     records, journal lines, times), with the schedule up to it.
//
// What it does not guarantee: a failing seed fails again on every replay
// (a fault can land a few milliseconds off); Shrink therefore keeps a
// schedule only when a replay fails the same checker.
package chaos

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// Shapes are the workloads a run can have (the job's command; see
// shapeScript).
var Shapes = []string{
	"quick",      // exits at once, with a random code
	"pipeline",   // a pipeline and background children in the group
	"setsid",     // a child that leaves the group with setsid
	"termignore", // leader and children ignore TERM
	"forkloop",   // forks short-lived children as fast as it can, for a bounded time
	"walker",     // a child forks a grandchild that calls setsid, then exits; the grandchild does the same
	"bigoutput",  // writes megabytes to its stdout, then sleeps
	"sleeper",    // one long sleep
}

// Nested is a shape of controller runs only: the job is itself an
// `agent-wrap ssh` (--mux off, lease 2s, grace 1s) to the same sshd and
// root, whose own job sleeps. One controller run in four is nested.
const Nested = "nested"

// hostFaults are what the nemesis does to any run. Each targets one run
// (see Step.Run).
var hostFaults = []string{
	"kill-wrapper", "stop-wrapper", // SIGKILL / SIGSTOP then SIGCONT of the run's wrapper
	"kill-cancel", "stop-cancel", // a `cancel` of the run, SIGKILLed / SIGSTOPped soon after it starts
	"kill-renew", "stop-renew", // the same for a `renew`
	"kill-attach", "stop-attach", // the same for an `attach` following the run
	"kill-watchdog", "stop-watchdog", // the root's watchdog (restarted after a kill, as systemd would)
	"fill",                                         // the run root's tmpfs filled to the last byte, freed after a pause
	"ro",                                           // the root read-only for every command but the wrappers, then read-write after a pause
	"tear-status", "tear-deadline", "tear-journal", // a file of the run cut short or garbled
	"cancel", "cancel2", // a cancel; two at once
	"renew", // a renewal
	"gc",    // not a fault but work beside the runs: `gc --older-than 1s` on the run's root
}

// sshFaults are what it does besides to a run driven by `agent-wrap ssh`.
var sshFaults = []string{
	"cut",                                // every connection through the relay closed
	"blackhole",                          // the relay forwards nothing, in either direction, for a pause
	"kill-controller", "stop-controller", // the `agent-wrap ssh` process
	"kill-sshd", "stop-sshd", // SIGKILL of every per-connection sshd; SIGSTOP of those and the listening sshd, SIGCONT after a pause
	"kill-ssh-client", "stop-ssh-client", // the `ssh` processes the run's controller started (its children, masters aside)
	"kill-master", "stop-master", // the ControlMasters the controllers recorded in their mux directory
	"settle", // work beside the runs: `settle --all` of the controllers' ledger while they drive their runs
}

// pgFaults are what it does besides to a controller run whose ledger is
// in PostgreSQL (RunSpec.PG): to the schedule's own server.
var pgFaults = []string{
	"kill-pg-backend", "stop-pg-backend", // the backend serving the run's controller (SIGKILL: the server resets every connection)
	"stop-postmaster", // the postmaster: new connections wait, existing ones go on
	"kill-postmaster", // SIGKILL of the postmaster, its backends left to exit; restarted after a pause (crash recovery)
}

// ctlFaults are the faults drawn over a controller run (the PostgreSQL
// ones are drawn apart, so that adding them changed no seed's draws).
var ctlFaults = append(append([]string{}, hostFaults...), sshFaults...)

// Faults are every fault, as the coverage table lists them.
var Faults = append(append([]string{}, ctlFaults...), pgFaults...)

// Phases of a run in which a fault can land, as seen when it lands.
var Phases = []string{"claim", "start", "running", "grace", "final"}

// phaseRank orders Phases: a run only moves forward through them.
var phaseRank = map[string]int{"claim": 0, "start": 1, "running": 2, "grace": 3, "final": 4}

// RunSpec is one run of a schedule.
type RunSpec struct {
	Index int
	At    time.Duration // offset of the launch from the schedule's start
	Shape string
	Other bool // run as the second user, without a cgroup
	Lease time.Duration
	Grace time.Duration
	Fg    bool // `run` in the foreground (the harness holds it), else --detach
	// SSH: driven by `agent-wrap ssh` from this machine, through the
	// relay, to the sshd on 127.0.0.1 (as root; Fg and Other do not apply).
	SSH bool
	// LateRenew (SSH runs only): the controller renews every 3 leases
	// (--renew-every), too late to hold the lease: the run meets its
	// deadline and grace while its controller still drives it, as a
	// controller too slow to renew would. Without it a controller
	// renews until the job ends, and a 60 s job never sees its deadline.
	LateRenew bool
	// PG (SSH runs only): the controller's ledger is a database of a
	// PostgreSQL server of the schedule's own, not a directory.
	PG bool
}

// Step is one fault.
type Step struct {
	At    time.Duration // offset from the schedule's start
	Fault string
	Run   int           // the RunSpec it targets
	Aim   string        // the phase it was aimed at (it may land in another)
	Pause time.Duration // for stops, fill and ro: how long until undone; for cancel/renew kills: delay before the kill
	Arg   int           // fault-specific: tear mode, exit code...
}

// Schedule is a seed's workload and nemesis.
type Schedule struct {
	Seed    uint64
	Options Options // what it was drawn with
	Runs    []RunSpec
	Steps   []Step
}

// Replay is the command that plays the schedule again.
func (s Schedule) Replay() string {
	o := s.Options
	if o == (Options{OtherUser: true, SSH: true, PG: true}).withDefaults() {
		return fmt.Sprintf("make chaos SEED=%d", s.Seed)
	}
	cmd := fmt.Sprintf("bin/awchaos -bin bin/agent-wrap -count 1 -seed %d -runs %d -faults %d -ssh=%v -pg=%v", s.Seed, o.Runs, o.Faults, o.SSH, o.PG)
	if !o.OtherUser {
		cmd += ` -user ""`
	}
	return cmd
}

// Options shape what Generate draws.
type Options struct {
	Runs      int  // runs per schedule (default 10)
	Faults    int  // faults per run: 1 to 2×Faults, drawn (default 4)
	OtherUser bool // some runs as the second user
	// SSH adds 1 or 2 runs driven by `agent-wrap ssh` (and their faults,
	// the relay's among them), drawn from a stream of their own: the other
	// runs and faults of a seed are the same with SSH or without.
	SSH bool
	// PG (with SSH) gives one controller run in two a ledger in
	// PostgreSQL, and 1 or 2 faults of the server, drawn from a fourth
	// stream: the rest of a seed's schedule is the same with PG or without.
	PG bool
}

func (o Options) withDefaults() Options {
	if o.Runs <= 0 {
		o.Runs = 10
	}
	if o.Faults <= 0 {
		o.Faults = 4
	}
	return o
}

// Generate draws the schedule of seed.
func Generate(seed uint64, o Options) Schedule {
	o = o.withDefaults()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := Schedule{Seed: seed, Options: o}
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+r.IntN(hi-lo+1)) * time.Millisecond }
	for i := range o.Runs {
		rs := RunSpec{
			Index: i,
			At:    ms(0, 1500),
			Shape: Shapes[r.IntN(len(Shapes))],
			Other: o.OtherUser && r.IntN(3) == 0,
			Lease: time.Duration(2+r.IntN(3)) * time.Second,
			Grace: time.Duration(1+r.IntN(2)) * time.Second,
			Fg:    r.IntN(3) == 0,
		}
		if r.IntN(8) == 0 {
			rs.Grace = 8 * time.Second // a long grace beside short ones
		}
		s.Runs = append(s.Runs, rs)
		s.Steps = append(s.Steps, drawFaults(r, rs, o, hostFaults)...)
	}
	if o.SSH {
		rs2 := rand.New(rand.NewPCG(seed^0x5348, seed+0x5348))
		rs3 := rand.New(rand.NewPCG(seed^0x4354, seed+0x4354))
		rs4 := rand.New(rand.NewPCG(seed^0x5047, seed+0x5047))
		n := 2 + rs2.IntN(2)
		for k := 0; k < n; k++ {
			run := RunSpec{Index: o.Runs + k, At: time.Duration(rs2.IntN(1501)) * time.Millisecond, Shape: Shapes[rs2.IntN(len(Shapes))],
				Lease: time.Duration(2+rs2.IntN(3)) * time.Second, Grace: time.Duration(1+rs2.IntN(2)) * time.Second, SSH: true}
			if rs3.IntN(4) == 0 {
				run.Shape = Nested
			}
			run.LateRenew = rs3.IntN(2) == 0
			if run.LateRenew && run.Shape != Nested && rs3.IntN(2) == 0 {
				// A job that obeys TERM is in its grace for milliseconds;
				// one that ignores it, for the whole grace: the window in
				// which the controller's grace faults land.
				run.Shape = "termignore"
			}
			run.PG = o.PG && rs4.IntN(2) == 0
			s.Runs = append(s.Runs, run)
			s.Steps = append(s.Steps, drawFaults(rs2, run, o, ctlFaults)...)
			// And 2 to 5 faults of the controller's own, from a third
			// stream (the first two stay what they were). Drawn over all
			// faults, these are too rare to cover every phase, and the
			// late ones are narrow (a controller lives past its host's
			// final record only for a moment): the phase is drawn
			// first: grace three times as often as claim, start or
			// running, final twice.
			late := []string{"claim", "start", "running", "grace", "grace", "grace", "final", "final"}
			for range 2 + rs3.IntN(4) {
				st := Step{Fault: sshFaults[rs3.IntN(len(sshFaults))], Run: run.Index, Aim: late[rs3.IntN(len(late))]}
				s.Steps = append(s.Steps, timeFault(rs3, run, st))
			}
			// A PostgreSQL ledger's faults, from the fourth stream, phase
			// first like the controller's own: the controller writes the
			// launching row at the claim, heartbeats while the run runs,
			// and settles it in its grace or at its end.
			if run.PG {
				for range 2 + rs4.IntN(3) {
					st := Step{Fault: pgFaults[rs4.IntN(len(pgFaults))], Run: run.Index, Aim: late[rs4.IntN(len(late))]}
					s.Steps = append(s.Steps, timeFault(rs4, run, st))
				}
			}
		}
	}
	// A full disk while runs are still being claimed refuses every claim
	// of the schedule for as long as it lasts: such a fill is cut to a
	// quarter, so that the runs it spares live on to meet the later
	// faults (a controller run's host claims up to 2 s after its launch).
	var lastLaunch time.Duration
	for _, rs := range s.Runs {
		lastLaunch = max(lastLaunch, rs.At)
	}
	for i, st := range s.Steps {
		if st.Fault == "fill" && st.At < lastLaunch+2*time.Second {
			s.Steps[i].Pause = st.Pause / 4
		}
	}
	s.sort()
	return s
}

// drawFaults draws the faults of run rs from list.
func drawFaults(r *rand.Rand, rs RunSpec, o Options, list []string) []Step {
	var out []Step
	n := 1 + r.IntN(2*o.Faults)
	for j := 0; j < n; j++ {
		st := Step{Fault: list[r.IntN(len(list))], Run: rs.Index, Aim: Phases[r.IntN(len(Phases))]}
		out = append(out, timeFault(r, rs, st))
	}
	return out
}

// timeFault draws the moment of st in the phase it is aimed at, and its
// pause and argument.
func timeFault(r *rand.Rand, rs RunSpec, st Step) Step {
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+r.IntN(hi-lo+1)) * time.Millisecond }
	dl := rs.At + rs.Lease
	switch st.Aim {
	case "claim":
		st.At = rs.At
	case "start":
		st.At = rs.At + ms(5, 60)
	case "running":
		st.At = rs.At + ms(200, int(rs.Lease/time.Millisecond)-200)
	case "grace":
		st.At = dl + ms(0, int(rs.Grace/time.Millisecond))
	case "final":
		st.At = dl + rs.Grace + ms(0, 800)
	}
	st.Pause = ms(300, 4000)
	if strings.HasPrefix(st.Fault, "stop-") && r.IntN(4) == 0 {
		st.Pause = ms(15000, 30000) // stopped past the lease bound
	}
	switch st.Fault {
	case "kill-cancel", "stop-cancel", "kill-renew", "stop-renew", "kill-attach", "stop-attach":
		st.Arg = r.IntN(40) // ms from the helper's start to the signal
		if st.Aim == "final" || st.Aim == "grace" && strings.HasSuffix(st.Fault, "-renew") {
			// Of a run that is over, a helper answers at once, and a
			// renewal of one that is stopping is refused at once: only
			// a signal sent within a few milliseconds finds it.
			st.Arg /= 10
		}
	case "tear-status", "tear-deadline", "tear-journal":
		st.Arg = r.IntN(3) // 0: cut 3 bytes, 1: garbage, 2: empty
	}
	return st
}

func (s *Schedule) sort() {
	sort.SliceStable(s.Steps, func(i, j int) bool { return s.Steps[i].At < s.Steps[j].At })
	sort.SliceStable(s.Runs, func(i, j int) bool { return s.Runs[i].At < s.Runs[j].At })
}

// String prints the schedule, one line per launch and fault, in time
// order: what a failure report shows.
func (s Schedule) String() string {
	return s.Until(-1)
}

// Until prints the schedule's lines up to offset t (all when t < 0).
func (s Schedule) Until(t time.Duration) string {
	type line struct {
		at time.Duration
		s  string
	}
	var ls []line
	for _, r := range s.Runs {
		who, mode := "root", "--detach"
		if r.Other {
			who = "user2"
		}
		if r.Fg {
			mode = "foreground"
		}
		if r.SSH {
			who, mode = "root", "through agent-wrap ssh"
			if r.LateRenew {
				mode += " renewing too late"
			}
			if r.PG {
				mode += " (ledger in PostgreSQL)"
			}
		}
		ls = append(ls, line{r.At, fmt.Sprintf("run %d: %s %s as %s, lease %v grace %v", r.Index, r.Shape, mode, who, r.Lease, r.Grace)})
	}
	for _, st := range s.Steps {
		extra := ""
		switch {
		case st.Fault == "fill" || st.Fault == "ro" || strings.HasPrefix(st.Fault, "stop-"):
			extra = fmt.Sprintf(" for %v", st.Pause)
		}
		if st.Arg != 0 {
			extra += fmt.Sprintf(" arg %d", st.Arg)
		}
		ls = append(ls, line{st.At, fmt.Sprintf("%s on run %d (aimed at %s)%s", st.Fault, st.Run, st.Aim, extra)})
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].at < ls[j].at })
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d:\n", s.Seed)
	for _, l := range ls {
		if t >= 0 && l.at > t {
			break
		}
		fmt.Fprintf(&b, "  +%6.3fs %s\n", l.at.Seconds(), l.s)
	}
	return b.String()
}

// Without returns the schedule with the faults at the given indexes left
// out; every run is kept.
func (s Schedule) Without(drop map[int]bool) Schedule {
	out := Schedule{Seed: s.Seed, Options: s.Options, Runs: s.Runs}
	for i, st := range s.Steps {
		if !drop[i] {
			out.Steps = append(out.Steps, st)
		}
	}
	return out
}

// OnlyRuns keeps the runs in keep and the faults that target them.
func (s Schedule) OnlyRuns(keep map[int]bool) Schedule {
	out := Schedule{Seed: s.Seed, Options: s.Options}
	for _, r := range s.Runs {
		if keep[r.Index] {
			out.Runs = append(out.Runs, r)
		}
	}
	for _, st := range s.Steps {
		if keep[st.Run] {
			out.Steps = append(out.Steps, st)
		}
	}
	return out
}
