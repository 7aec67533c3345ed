package chaos

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Coverage counts, per fault and phase, how often a fault landed in that
// phase of a run (the "sometimes" assertions: each pair should be hit at
// least once in a default campaign). It is safe for concurrent use.
type Coverage struct {
	mu     sync.Mutex
	hits   map[string]int // "fault phase"
	missed map[string]int // fault: times it could not land (no process to hit, mount busy)
	runs   int
	faults int
}

// NewCoverage returns empty counters.
func NewCoverage() *Coverage {
	return &Coverage{hits: map[string]int{}, missed: map[string]int{}}
}

// Hit counts fault landing in phase.
func (c *Coverage) Hit(fault, phase string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hits[fault+" "+phase]++
	c.faults++
}

// Miss counts a fault that found nothing to act on.
func (c *Coverage) Miss(fault string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.missed[fault]++
}

// Run counts one run launched.
func (c *Coverage) Run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs++
}

// Totals are the runs launched and faults landed so far.
func (c *Coverage) Totals() (runs, faults int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs, c.faults
}

// Count is how often fault landed in phase.
func (c *Coverage) Count(fault, phase string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits[fault+" "+phase]
}

// Unhit lists the fault × phase pairs never hit, as "fault phase".
func (c *Coverage) Unhit() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, f := range Faults {
		for _, p := range Phases {
			if c.hits[f+" "+p] == 0 {
				out = append(out, f+" "+p)
			}
		}
	}
	return out
}

// Add adds o's counts to c.
func (c *Coverage) Add(o *Coverage) {
	o.mu.Lock()
	hits, missed, runs, faults := map[string]int{}, map[string]int{}, o.runs, o.faults
	for k, v := range o.hits {
		hits[k] = v
	}
	for k, v := range o.missed {
		missed[k] = v
	}
	o.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range hits {
		c.hits[k] += v
	}
	for k, v := range missed {
		c.missed[k] += v
	}
	c.runs += runs
	c.faults += faults
}

// String is the coverage table: one row per fault, one column per phase,
// then the pairs never hit.
func (c *Coverage) String() string {
	c.mu.Lock()
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s", "fault")
	for _, p := range Phases {
		fmt.Fprintf(&b, " %8s", p)
	}
	fmt.Fprintf(&b, " %8s\n", "no-land")
	for _, f := range Faults {
		fmt.Fprintf(&b, "%-16s", f)
		for _, p := range Phases {
			fmt.Fprintf(&b, " %8d", c.hits[f+" "+p])
		}
		fmt.Fprintf(&b, " %8d\n", c.missed[f])
	}
	fmt.Fprintf(&b, "runs %d, faults landed %d\n", c.runs, c.faults)
	c.mu.Unlock()
	un := c.Unhit()
	sort.Strings(un)
	if len(un) == 0 {
		b.WriteString("every fault × phase was hit\n")
	} else {
		fmt.Fprintf(&b, "not hit (%d of %d): %s\n", len(un), len(Faults)*len(Phases), strings.Join(un, ", "))
	}
	return b.String()
}
