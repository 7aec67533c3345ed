//go:build linux

// Command awchaos runs agent-wrap's seeded fault campaign (package chaos)
// against a real binary: `make chaos [SEED=n] [DURATION=d]`.
//
// It needs root (a tmpfs for the run roots, a second user, cgroups). It
// plays schedules from -seed on until -duration has passed or one fails;
// a failure prints the seed, the schedule up to the first violation, each
// violation's evidence and the timeline, then shrinks the schedule (replays
// of cut schedules that fail the same checker) and prints the shortest.
// The coverage table (fault × phase) is printed at the end. Exit: 0 no
// violation; 1 a violation; 2 the harness could not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/chaos"
	"github.com/agent-wrap/agent-wrap/internal/pgtest"
	"github.com/agent-wrap/agent-wrap/internal/relay"
)

func main() {
	relay.Connector() // ssh starts this program again as its ProxyCommand
	os.Exit(run())
}

func run() int {
	var (
		bin      = flag.String("bin", "bin/agent-wrap", "the agent-wrap binary under test")
		seed     = flag.Uint64("seed", 0, "first seed (0: one from the clock, printed)")
		duration = flag.Duration("duration", 20*time.Minute, "play schedules until this much time has passed")
		count    = flag.Int("count", 0, "play this many schedules instead of -duration (SEED=n alone plays 1)")
		runs     = flag.Int("runs", 0, "runs per schedule (default 10)")
		faults   = flag.Int("faults", 0, "faults per run: 1 to twice this, drawn (default 4)")
		userName = flag.String("user", "awchaos", "the second user, created if missing (\"\": every run as root)")
		slack    = flag.Duration("slack", 3*time.Second, "added to the lease bound for a loaded machine")
		shrink   = flag.Int("shrink", 12, "replays the shrinker may make of a failing schedule (0: no shrinking)")
		sshRuns  = flag.Bool("ssh", true, "add 1 or 2 runs per schedule driven by agent-wrap ssh through a relay to a local sshd")
		pgRuns   = flag.Bool("pg", true, "with -ssh, give one controller run in two a ledger in PostgreSQL (a server per schedule) and its faults")
		parallel = flag.Int("parallel", 3, "schedules played at once, each on its own tmpfs")
		keepOn   = flag.Bool("keep-going", false, "play on after a failing schedule (report every failing seed at the end; no shrinking)")
		print    = flag.Bool("schedule", false, "print the schedule of -seed and exit (nothing is played)")
		verbose  = flag.Bool("v", false, "print the timeline as it happens")
	)
	flag.Parse()
	if *print {
		fmt.Print(chaos.Generate(*seed, chaos.Options{Runs: *runs, Faults: *faults, OtherUser: *userName != "", SSH: *sshRuns, PG: *pgRuns}))
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "awchaos: needs root (a tmpfs for the run roots, a second user, cgroups)\nhint: sudo make chaos")
		return 2
	}
	if _, err := os.Stat(*bin); err != nil {
		fmt.Fprintf(os.Stderr, "awchaos: the binary under test: %v\nhint: make build, or -bin PATH\n", err)
		return 2
	}
	if *pgRuns && *sshRuns {
		if err := pgtest.Missing(); err != nil {
			fmt.Fprintf(os.Stderr, "awchaos: %v\nhint: make deps, or -pg=false\n", err)
			return 2
		}
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano()%1_000_000) + 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	cfg := chaos.Config{Bin: *bin, Slack: *slack}
	if *verbose {
		cfg.Log = os.Stdout
	}
	if *userName != "" {
		if err := chaos.EnsureUser(*userName); err != nil {
			fmt.Fprintf(os.Stderr, "awchaos: %v\nhint: -user \"\" plays every run as root\n", err)
			return 2
		}
		cfg.User = *userName
	}
	camp := chaos.Campaign{Config: cfg, Options: chaos.Options{Runs: *runs, Faults: *faults, OtherUser: *userName != "", SSH: *sshRuns, PG: *pgRuns},
		First: *seed, Duration: *duration, Count: *count, Parallel: *parallel, KeepGoing: *keepOn, Out: os.Stdout}
	fmt.Printf("awchaos: seeds from %d, %v (replay one: make chaos SEED=n)\n", *seed, *duration)
	cov := chaos.NewCoverage()
	t0 := time.Now()
	results, err := camp.Run(ctx, cov)
	if err != nil {
		fmt.Fprintf(os.Stderr, "awchaos: %v\n", err)
		return 2
	}
	runsN, faultsN := cov.Totals()
	fmt.Printf("\n%d schedules, %d runs, %d faults in %v\n", len(results), runsN, faultsN, time.Since(t0).Round(time.Second))
	fmt.Print(cov.String())
	var bad *chaos.Result
	nbad := 0
	for _, r := range results {
		if r.Failed() {
			if bad == nil {
				bad = r
			}
			nbad++
			fmt.Printf("FAILED: seed %d (%s)\n", r.Schedule.Seed, r.Names())
		}
	}
	if nbad > 0 {
		fmt.Printf("%d of %d schedules failed\n", nbad, len(results))
	}
	if bad == nil {
		fmt.Println("0 violations")
		return 0
	}
	for _, r := range results {
		if r.Failed() {
			fmt.Println()
			fmt.Print(r.Report())
		}
	}
	if *shrink > 0 && !*keepOn {
		fmt.Printf("\nshrinking seed %d (at most %d replays)...\n", bad.Schedule.Seed, *shrink)
		small := chaos.Shrink(bad.Schedule, func(c chaos.Schedule) bool {
			r, err := chaos.Play(ctx, cfg, c, nil)
			ok := err == nil && chaos.FailsLike(bad, r)
			fmt.Printf("  %d runs, %d faults: fails like it: %v\n", len(c.Runs), len(c.Steps), ok)
			return ok
		}, *shrink)
		fmt.Printf("shortest failing schedule found:\n%s", small)
	}
	return 1
}
