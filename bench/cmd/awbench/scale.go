package main

// The scale figure: a host carrying many runs at once. N runs of `sleep
// 3600` (1000; 200 with -quick; BENCH_SCALE_RUNS overrides) are started at
// once, each by its own `agent-wrap run --no-stream`, the way N ssh
// sessions would start them; while all N live, their memory is taken
// (Pss summed over the wrappers: what they cost the host together), and
// `list --json` and `watchdog --once` over the root are timed against
// reading every status.json once (`awbench readall`); then `agent-wrap
// cancel` of every run is started at once, and every run must end
// confirmed: `cancelled`, exit 143, no survivors in its record, and no
// process of its group left in /proc. Baseline: N `tini -s -g -- sleep
// 3600` started at once, then TERMed at once, in the same run.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// scaleMem is the memory of a set of live processes, added up.
type scaleMem struct {
	pss, private int64 // bytes: Pss, Private_Clean + Private_Dirty
	threads      int
}

func memOf(pids []int) (scaleMem, error) {
	var m scaleMem
	for _, pid := range pids {
		pss, err := bench.RollupBytes(pid, "Pss")
		if err != nil {
			return m, err
		}
		pc, err := bench.RollupBytes(pid, "Private_Clean")
		if err != nil {
			return m, err
		}
		pd, err := bench.RollupBytes(pid, "Private_Dirty")
		if err != nil {
			return m, err
		}
		m.pss += pss
		m.private += pc + pd
		m.threads += threadsOf(pid)
	}
	return m, nil
}

func threadsOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func (r *runner) scaleRuns() (int, error) {
	n := r.n(1000, 200)
	if v := os.Getenv("BENCH_SCALE_RUNS"); v != "" {
		x, err := strconv.Atoi(v)
		if err != nil || x <= 0 {
			return 0, fmt.Errorf("BENCH_SCALE_RUNS=%q: not a positive number of runs", v)
		}
		n = x
	}
	return n, nil
}

func (r *runner) scale() error {
	n, err := r.scaleRuns()
	if err != nil {
		return err
	}
	root, err := r.newRoot("scale")
	if err != nil {
		return err
	}
	bStart, bStop, bMem, err := r.scaleTini(n)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}

	// Start all N at once.
	ids := make([]string, n)
	ws := make([]*started, n)
	t0 := time.Now()
	for i := range ids {
		id := fmt.Sprintf("scale-%04d", i)
		w, err := r.start(nil, nil, false, r.bin, "--root", root, "run", "--no-stream", "--lease", "30m", id, "--", "sleep", "3600")
		if err != nil {
			return fmt.Errorf("starting run %d of %d: %w", i+1, n, err)
		}
		ids[i], ws[i] = id, w
		r.onCleanup(func() { r.stopRun(root, id, w) })
	}
	forked := time.Since(t0)
	recs := make([]*statusfile.Record, n)
	var lastRunning time.Time
	err = bench.WaitUntil(5*time.Minute, 50*time.Millisecond, func() (bool, error) {
		pending := 0
		for i, id := range ids {
			if recs[i] != nil {
				continue
			}
			if rec, err := readRecord(root, id); err == nil && rec.State == statusfile.Running {
				recs[i], lastRunning = rec, time.Now()
				continue
			}
			if ws[i].done {
				return false, fmt.Errorf("run %s: its wrapper exited before the run was running", id)
			}
			pending++
		}
		return pending == 0, fmt.Errorf("%d of %d runs not running yet", pending, n)
	})
	if err != nil {
		return err
	}
	start := lastRunning.Sub(t0).Seconds()
	pids := make([]int, n)
	for i, w := range ws {
		pids[i] = w.pid
	}
	mem, err := memOf(pids)
	if err != nil {
		return err
	}

	// list and watchdog over the N live runs, against reading every record.
	listOut, err := os.CreateTemp(r.scratch, "list-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(listOut.Name())
	defer listOut.Close()
	list := func() (float64, error) {
		if err := listOut.Truncate(0); err != nil {
			return 0, err
		}
		if _, err := listOut.Seek(0, 0); err != nil {
			return 0, err
		}
		return r.timed(0, listOut, r.bin, "--root", root, "list", "--json")
	}
	wdOut, err := os.CreateTemp(r.scratch, "watchdog-*.out")
	if err != nil {
		return err
	}
	defer os.Remove(wdOut.Name())
	defer wdOut.Close()
	watchdog := func() (float64, error) { return r.timed(0, wdOut, r.bin, "--root", root, "watchdog", "--once") }
	readall := func() (float64, error) { return r.timed(0, nil, r.self, "readall", root) }
	// The order rotates each round, so no side always runs right after
	// the same other side; 15 rounds (a list is tens of milliseconds),
	// so that the median's 95 % interval is not the whole range.
	s, err := bench.InterleaveRotating(1, r.n(15, 5), list, readall, watchdog)
	if err != nil {
		return err
	}
	if err := checkListed(listOut.Name(), n); err != nil {
		return err
	}
	if b, _ := os.ReadFile(wdOut.Name()); len(bytes.TrimSpace(b)) > 0 {
		return fmt.Errorf("watchdog --once acted on live runs with an hour of lease left: %.300q", b)
	}

	// Cancel all N at once: every `cancel` started before the first is
	// waited for.
	// Each cancel's stderr goes to a file of its own, to be shown when it
	// does not confirm.
	errDir, err := os.MkdirTemp(r.scratch, "cancel-stderr-")
	if err != nil {
		return err
	}
	errFiles := make([]*os.File, n)
	for i, id := range ids {
		if errFiles[i], err = os.Create(filepath.Join(errDir, id)); err != nil {
			return err
		}
		defer errFiles[i].Close()
	}
	cs := make([]*started, n)
	t0 = time.Now()
	for i, id := range ids {
		c, err := r.start(nil, errFiles[i], false, r.bin, "--root", root, "cancel", id)
		if err != nil {
			return fmt.Errorf("starting cancel %d of %d: %w", i+1, n, err)
		}
		cs[i] = c
	}
	cancelForked := time.Since(t0)
	var last time.Time
	var cancelCPU float64
	for i, c := range cs {
		end, err := c.exited(5 * time.Minute)
		if err != nil {
			return fmt.Errorf("cancel %s: %w", ids[i], err)
		}
		last = maxTime(last, end)
		if err := c.wait(); err != nil {
			return err
		}
		if c.code() != 0 {
			said, _ := os.ReadFile(errFiles[i].Name())
			return fmt.Errorf("cancel %s exited %d, want 0 (confirmed): %.500q", ids[i], c.code(), said)
		}
		if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cancelCPU += time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		}
	}
	for i, w := range ws {
		end, err := w.exited(5 * time.Minute)
		if err != nil {
			return fmt.Errorf("run %s: the wrapper did not exit after its cancel: %w", ids[i], err)
		}
		last = maxTime(last, end)
		if err := w.wait(); err != nil {
			return err
		}
		if w.code() != 143 {
			return fmt.Errorf("run %s: the wrapper exited %d, want 143", ids[i], w.code())
		}
	}
	cancel := last.Sub(t0).Seconds()
	if err := confirmAll(root, ids, recs); err != nil {
		return err
	}

	per := func(total float64) string { return fmt.Sprintf("%.2f ms a run", total/float64(n)*1e3) }
	secs := func(v float64) string { return fmt.Sprintf("%.2f s", v) }
	mb := func(v int64) string { return fmt.Sprintf("%.2f MiB", float64(v)/mib) }
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("scale, %d runs of `sleep 3600` started at once, until all are running", n),
		measured: secs(start) + ", " + per(start),
		baseline: secs(bStart) + ", " + per(bStart) + " (tini -s -g, until every sleep runs)",
		ratio:    fmt.Sprintf("%.1f×", start/bStart),
		target:   "report", limit: "-", pass: "n/a",
	})
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("scale, `agent-wrap cancel` of all %d at once, every one confirmed", n),
		measured: secs(cancel) + ", " + per(cancel) + fmt.Sprintf("; %d confirmed, 0 survivors", n),
		baseline: secs(bStop) + ", " + per(bStop) + " (TERM to every tini at once)",
		ratio:    fmt.Sprintf("%.1f×", cancel/bStop),
		target:   "every run confirmed, 0 survivors", limit: "-", pass: "pass",
	})
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("scale, memory of %d live runs (Pss of the wrappers, summed)", n),
		measured: fmt.Sprintf("%s a run (%s in all)", mb(mem.pss/int64(n)), mb(mem.pss)),
		baseline: fmt.Sprintf("%s a run (tini)", mb(bMem.pss/int64(n))),
		ratio:    fmt.Sprintf("%.1f×", float64(mem.pss)/float64(bMem.pss)),
		target:   "≤ 3 MiB a run", limit: fmt.Sprintf("%.2f", float64(mem.pss)/float64(n)/(3*mib)),
		pass: passIf(float64(mem.pss)/float64(n) <= 3*mib),
	})
	l, b, w := bench.Median(s[0]), bench.Median(s[1]), bench.Median(s[2])
	for _, x := range []struct {
		name string
		v    float64
		i    int
	}{{"`list --json`", l, 0}, {"`watchdog --once`", w, 2}} {
		ratio, result := atMost(pairRatios(s[x.i], s[1]), 1.3)
		r.rows = append(r.rows, row{
			figure:   fmt.Sprintf("scale, %s over %d live runs", x.name, n),
			measured: bench.Ms(x.v), baseline: bench.Ms(b) + " (read every status.json)",
			ratio:  fmt.Sprintf("%.2f×", ratio),
			target: "≤ 1.3×", limit: fmt.Sprintf("%.2f", ratio/1.3),
			pass: result,
		})
	}
	r.detail("scale: %d wrappers forked in %s, all running after %s; tini baseline: every sleep running after %s",
		n, secs(forked.Seconds()), secs(start), secs(bStart))
	r.detail("scale, memory while all %d live: wrappers Pss %s in all, %s a run; private (Private_Clean + Private_Dirty) %s a run; %.1f threads a wrapper; tini: Pss %s a run, private %s a run, %.1f threads",
		n, mb(mem.pss), mb(mem.pss/int64(n)), mb(mem.private/int64(n)), float64(mem.threads)/float64(n),
		mb(bMem.pss/int64(n)), mb(bMem.private/int64(n)), float64(bMem.threads)/float64(n))
	r.detail("scale, cancel of all %d at once: %d `cancel` processes forked in %s, the last run confirmed after %s; CPU time of the cancel processes %.2f ms a run; TERM to %d tinis: all exited after %s",
		n, n, secs(cancelForked.Seconds()), secs(cancel), cancelCPU/float64(n)*1e3, n, secs(bStop))
	r.detail("scale, `list --json` over %d live runs: %s; `watchdog --once`: %s; read every status.json: %s; per-round ratios list/read %s, watchdog/read %s",
		n, spread(s[0], bench.Ms), spread(s[2], bench.Ms), spread(s[1], bench.Ms), fmtRatios(pairRatios(s[0], s[1])), fmtRatios(pairRatios(s[2], s[1])))
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// checkListed checks list --json's last output: n runs, all running.
func checkListed(path string, n int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) != n {
		return fmt.Errorf("list --json printed %d lines, want %d", len(lines), n)
	}
	for _, l := range lines {
		var x struct {
			RunID, State, Outcome string
		}
		if err := json.Unmarshal(l, &x); err != nil {
			return fmt.Errorf("list --json: %v: %q", err, l)
		}
		if x.State != statusfile.Running || x.Outcome != "running" {
			return fmt.Errorf("list --json: run %s is %s (%s), want running", x.RunID, x.State, x.Outcome)
		}
	}
	return nil
}

// confirmAll checks every run's final record (cancelled, exit 143, no
// survivors) and that /proc holds no live process of any run's group.
func confirmAll(root string, ids []string, live []*statusfile.Record) error {
	// A group's number is recycled once its last process is gone; a new
	// group under it is not the run's (see killGroupMembers).
	groups := map[int]uint64{}
	var errs []error
	for i, id := range ids {
		rec, err := readRecord(root, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rec.State != statusfile.Cancelled || rec.Code() != 143 || rec.Survivors == nil || len(rec.Survivors) != 0 {
			errs = append(errs, fmt.Errorf("run %s: state %s, exit %d, survivors %v; want cancelled, 143, []", id, rec.State, rec.Code(), rec.Survivors))
		}
		groups[live[i].PGID] = live[i].LeaderStart
	}
	all, err := proc.Scan()
	if err != nil {
		return err
	}
	recycled := map[int]bool{}
	for pgid, start := range groups {
		recycled[pgid] = groupRecycled(all, pgid, start)
	}
	for _, p := range all {
		if start, ok := groups[p.PGID]; ok && !recycled[p.PGID] && !p.Dead() && p.Start >= start {
			errs = append(errs, fmt.Errorf("process %d (%s) of group %d outlived its run's cancel", p.PID, p.Comm, p.PGID))
		}
	}
	return errors.Join(errs...)
}

// scaleTini is the baseline: n `tini -s -g -- sleep 3600` started at once,
// until every sleep runs; their memory; then TERM to every tini at once,
// until the last has exited.
func (r *runner) scaleTini(n int) (start, stop float64, mem scaleMem, err error) {
	ts := make([]*started, n)
	byPID := map[int]bool{}
	t0 := time.Now()
	for i := range ts {
		if ts[i], err = r.start(nil, nil, false, "tini", "-s", "-g", "--", "sleep", "3600"); err != nil {
			return 0, 0, mem, err
		}
		byPID[ts[i].pid] = true
	}
	var lastSeen time.Time
	err = bench.WaitUntil(5*time.Minute, 50*time.Millisecond, func() (bool, error) {
		all, err := proc.Scan()
		if err != nil {
			return false, err
		}
		sleeping := 0
		for _, p := range all {
			if byPID[p.PPID] && p.Comm == "sleep" && !p.Dead() {
				sleeping++
			}
		}
		lastSeen = time.Now()
		return sleeping == n, fmt.Errorf("%d of %d tinis have their sleep", sleeping, n)
	})
	if err != nil {
		return 0, 0, mem, err
	}
	start = lastSeen.Sub(t0).Seconds()
	pids := make([]int, n)
	for i, t := range ts {
		pids[i] = t.pid
	}
	if mem, err = memOf(pids); err != nil {
		return 0, 0, mem, err
	}
	t0 = time.Now()
	for _, t := range ts {
		if err := t.pfd.Signal(unix.SIGTERM); err != nil {
			return 0, 0, mem, err
		}
	}
	var last time.Time
	for _, t := range ts {
		end, err := t.exited(5 * time.Minute)
		if err != nil {
			return 0, 0, mem, err
		}
		last = maxTime(last, end)
		if err := t.wait(); err != nil {
			return 0, 0, mem, err
		}
		if t.code() != 143 {
			return 0, 0, mem, fmt.Errorf("tini exited %d, want 143", t.code())
		}
	}
	return start, last.Sub(t0).Seconds(), mem, nil
}

const scaleMethods = `- **scale**: N runs of ` + "`sleep 3600`" + ` (1000; 200 with BENCH_QUICK; BENCH_SCALE_RUNS
  overrides), each started by its own ` + "`agent-wrap run --no-stream --lease 30m`" + `, all
  forked at once; the clock stops when the last record says ` + "`running`" + `. While all
  live: Pss and private memory (/proc/PID/smaps_rollup) of every wrapper, added
  up (Pss charges each page of the binary shared by N wrappers 1/N to each, so the
  sum is what the N cost the host); ` + "`list --json`" + ` (every run listed, running) and
  ` + "`watchdog --once`" + ` (no action) over the root against ` + "`awbench readall`" + `, in
  alternation, the order rotated each round, 15 rounds (5 with BENCH_QUICK),
  each ratio the median of the rounds' own. Then one ` + "`agent-wrap cancel ID`" + `
  per run, all forked at once; the clock stops when the last cancel and the
  last wrapper have exited. Every cancel must exit 0, every wrapper 143, every
  record be ` + "`cancelled`" + ` with exit 143 and ` + "`survivors: []`" + `, and /proc hold no live process
  of any run's group. Baseline, in the same run: N ` + "`tini -s -g -- sleep 3600`" + `
  forked at once until every sleep runs, their memory, then TERM to every tini
  at once until the last exits.
`
