package chaos

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// Campaign plays schedules of seeds First, First+1, ..., Parallel at a
// time (each on its own tmpfs, with its own watchdogs), until Duration has
// passed (Count > 0: that many schedules instead) or a schedule fails
// (unless KeepGoing).
type Campaign struct {
	Config
	Options
	First    uint64
	Duration time.Duration
	Count    int
	Parallel int // schedules played at once (default 1)
	// KeepGoing plays on after a failing schedule (to measure a
	// campaign, or collect several failing seeds at once).
	KeepGoing bool
	Out       io.Writer // one line per schedule
}

// Run plays the campaign; cov gathers coverage over all of it. It returns
// every result in seed order; Failed tells which failed.
func (c Campaign) Run(ctx context.Context, cov *Coverage) ([]*Result, error) {
	par := max(c.Parallel, 1)
	t0 := time.Now()
	var (
		mu      sync.Mutex
		results = map[uint64]*Result{}
		next    = c.First
		failed  bool
		firstEr error
		wg      sync.WaitGroup
	)
	take := func() (uint64, bool) {
		mu.Lock()
		defer mu.Unlock()
		n := int(next - c.First)
		switch {
		case failed || firstEr != nil || ctx.Err() != nil:
			return 0, false
		case c.Count > 0 && n >= c.Count:
			return 0, false
		case c.Count <= 0 && n > 0 && time.Since(t0) >= c.Duration:
			return 0, false
		}
		next++
		return next - 1, true
	}
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seed, ok := take()
				if !ok {
					return
				}
				s := Generate(seed, c.Options)
				res, err := Play(ctx, c.Config, s, cov)
				mu.Lock()
				if err != nil {
					if firstEr == nil {
						firstEr = fmt.Errorf("seed %d: %w", seed, err)
					}
					mu.Unlock()
					return
				}
				results[seed] = res
				if res.Failed() && !c.KeepGoing {
					failed = true
				}
				runs, faults := cov.Totals()
				if c.Out != nil {
					verdict := "ok"
					if res.Failed() {
						verdict = fmt.Sprintf("FAILED (%d violations: %s)", len(res.Violations), res.Names())
					}
					fmt.Fprintf(c.Out, "seed %d: %d runs, %d faults drawn, %.1fs: %s [total %d runs, %d faults landed, %.0fs]\n",
						seed, len(s.Runs), len(s.Steps), res.Elapsed.Seconds(), verdict, runs, faults, time.Since(t0).Seconds())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var out []*Result
	for s := c.First; s < next; s++ {
		if r := results[s]; r != nil {
			out = append(out, r)
		}
	}
	return out, firstEr
}

// Names is the checkers that failed in r, comma-separated.
func (r *Result) Names() string {
	seen := map[string]bool{}
	s := ""
	for _, v := range r.Violations {
		if !seen[v.Checker] {
			if s != "" {
				s += ", "
			}
			s += v.Checker
			seen[v.Checker] = true
		}
	}
	return s
}

// FailsLike reports whether b broke one of the checkers a broke: what a
// shrinker keeps.
func FailsLike(a, b *Result) bool {
	want := map[string]bool{}
	for _, v := range a.Violations {
		want[v.Checker] = true
	}
	for _, v := range b.Violations {
		if want[v.Checker] {
			return true
		}
	}
	return false
}
