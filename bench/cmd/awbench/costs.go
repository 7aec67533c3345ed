package main

import (
	"fmt"
	"os"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// costs measures the building blocks the figures are made of, with the
// project's own packages, in the same run: starting a Go binary, one
// record replaced with and without the directory fsync, one journal line
// with and without its fsync, and one read of the whole process table. The
// causes of a missed target are stated in these units.
func (r *runner) costs() error {
	rootPath, err := r.newRoot("costs")
	if err != nil {
		return err
	}
	root, err := rundir.OpenRoot(rootPath, false)
	if err != nil {
		return err
	}
	defer root.Close()
	d, err := root.Create("costs")
	if err != nil {
		return err
	}
	defer d.Close()
	rec := &statusfile.Record{RunID: "costs", State: statusfile.Running, Command: []string{"true"}, Survivors: []int{}}
	timeIt := func(f func() error) func() (float64, error) {
		return func() (float64, error) {
			t0 := bench.Now()
			err := f()
			return bench.Since(t0), err
		}
	}
	nprocs := 0
	items := []struct {
		name string
		f    func() (float64, error)
	}{
		{"exec `agent-wrap version` (a Go binary's start and exit)", func() (float64, error) { return r.timed(0, nil, r.bin, "version") }},
		{"exec `true` (a C binary's start and exit)", func() (float64, error) { return r.timed(0, nil, "true") }},
		{"status.json replaced, not durable (renameio: 1 fsync)", timeIt(func() error { return statusfile.Write(d, rec, false) })},
		{"status.json replaced, durable (2 fsyncs: file, directory)", timeIt(func() error { return statusfile.Write(d, rec, true) })},
		{"journal line, synced (1 fsync)", timeIt(func() error { _, err := journal.Append(d, "bench", journal.Fields{"pid": 1}, true); return err })},
		{"journal line, not synced", timeIt(func() error { _, err := journal.Append(d, "bench", journal.Fields{"pid": 1}, false); return err })},
		{"proc.Scan (every /proc/PID/stat once)", timeIt(func() error {
			ps, err := proc.Scan()
			nprocs = len(ps)
			return err
		})},
	}
	fns := make([]func() (float64, error), len(items))
	for i := range items {
		fns[i] = items[i].f
	}
	s, err := bench.Interleave(2, r.n(30, 15), fns...)
	if err != nil {
		return err
	}
	for i, it := range items {
		name := it.name
		if i == len(items)-1 {
			name = fmt.Sprintf("%s, %d processes", name, nprocs)
		}
		r.costRows = append(r.costRows, fmt.Sprintf("| %s | %s | %s |", name, bench.Ms(bench.Median(s[i])), spread(s[i], bench.Ms)))
	}
	return os.RemoveAll(rootPath)
}
