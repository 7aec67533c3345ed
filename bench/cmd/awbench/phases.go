package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// phases splits the samples of a figure at the events of each run's own
// journal: where the time goes between the start of the clock and the end.
// A journal line's `at` is stamped before the line is written (and synced),
// so a segment ending at an event holds the work before that event, and a
// synced write shows up in the segment after it.
type phases struct {
	marks []string    // journal events, in order
	segs  [][]float64 // per segment (len(marks)+1), seconds
	miss  map[string]int
}

func newPhases(marks ...string) *phases {
	return &phases{marks: marks, segs: make([][]float64, len(marks)+1), miss: map[string]int{}}
}

// add records one sample: t0 when the clock started, end when it stopped,
// and the run's journal in between.
func (p *phases) add(root, id string, t0, end time.Time) {
	f, err := os.Open(filepath.Join(root, id, rundir.EventsFile))
	if err != nil {
		p.miss["journal"]++
		return
	}
	defer f.Close()
	es, err := journal.ReadAll(f)
	if err != nil {
		p.miss["journal"]++
		return
	}
	prev := t0
	for i, m := range p.marks {
		at, ok := firstAfter(es, m, t0)
		if !ok {
			p.miss[m]++
			return
		}
		p.segs[i] = append(p.segs[i], at.Sub(prev).Seconds())
		prev = at
	}
	p.segs[len(p.marks)] = append(p.segs[len(p.marks)], end.Sub(prev).Seconds())
}

func firstAfter(es []journal.Entry, event string, t0 time.Time) (time.Time, bool) {
	for _, e := range es {
		if e.Event == event && !e.At.Before(t0.Add(-time.Second)) {
			return e.At, true
		}
	}
	return time.Time{}, false
}

// String renders the median of each segment: "start→created 3.10 ms, ...".
func (p *phases) String(start, end string) string {
	names := append([]string{start}, p.marks...)
	names = append(names, end)
	var parts []string
	for i, s := range p.segs {
		if len(s) == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s→%s %s", names[i], names[i+1], bench.Ms(bench.Median(s))))
	}
	out := strings.Join(parts, ", ")
	for m, n := range p.miss {
		out += fmt.Sprintf(" (%d samples without %s)", n, m)
	}
	return out
}
