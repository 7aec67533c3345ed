package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// The floor figures: agent-wrap against a program that does only
// the file work the contract needs around one job (bench/cmd/awfloor, built
// by `make bench` beside awbench), sampled in the same rounds as setsid and
// tini, so each figure is reported against all three.

// atMost judges per-round ratios against an upper target: the median of
// the rounds' own ratios (each side sampled back to back, so a slow spell
// of the host lands on both), and "undecided" when that median's 95 %
// confidence interval (bench.MedianCI) contains the target, as the output
// figure does.
func atMost(ratios []float64, target float64) (ratio float64, result string) {
	ratio = bench.Median(ratios)
	lo, hi := bench.MedianCI(ratios)
	result = passIf(ratio <= target)
	if lo < target && target < hi {
		result = fmt.Sprintf("undecided: the median's 95 %% interval %.2f-%.2f contains the target", lo, hi)
	}
	return ratio, result
}

// floorBin is bin/awfloor, beside this program.
func (r *runner) floorBin() (string, error) {
	p := filepath.Join(filepath.Dir(r.self), "awfloor")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the floor program: %w (make bench builds it: go build -o bin/awfloor ./bench/cmd/awfloor)", err)
	}
	return p, nil
}

func (r *runner) floor() error {
	fl, err := r.floorBin()
	if err != nil {
		return err
	}
	root, err := r.newRoot("floor")
	if err != nil {
		return err
	}
	if err := r.floorStart(fl, root); err != nil {
		return err
	}
	return r.floorCancel(fl, root)
}

// floorStart: a run of `true`, fork to exit.
func (r *runner) floorStart(fl, root string) error {
	ph := newPhases("created", "started", "leader_exited", "final")
	aw := func() (float64, error) {
		id := r.id("fs")
		t0, end, err := r.span(0, nil, r.bin, "--root", root, "run", "--no-stream", "--lease", "0", id, "--", "true")
		ph.add(root, id, t0, end)
		return end.Sub(t0).Seconds(), err
	}
	awLease := func() (float64, error) {
		return r.timed(0, nil, r.bin, "--root", root, "run", "--no-stream", r.id("fs"), "--", "true")
	}
	floor := func() (float64, error) { return r.timed(0, nil, fl, root, r.id("ff"), "true") }
	setsid := func() (float64, error) { return r.timed(0, nil, "setsid", "-w", "true") }
	tini := func() (float64, error) { return r.timed(0, nil, "tini", "-s", "-g", "--", "true") }
	// The binaries' own start, in the same rounds: agent-wrap doing next to
	// nothing (version: the runtime, every package's init, the command line)
	// against awfloor doing nothing (no arguments: usage, exit 64).
	version := func() (float64, error) { return r.timed(0, nil, r.bin, "version") }
	floorSelf := func() (float64, error) { return r.timed(64, nil, fl) }
	s, err := bench.Interleave(3, r.n(40, 15), aw, floor, setsid, tini, awLease, version, floorSelf)
	if err != nil {
		return err
	}
	a, f, ss, t := bench.Median(s[0]), bench.Median(s[1]), bench.Median(s[2]), bench.Median(s[3])
	ratio, result := atMost(pairRatios(s[0], s[1]), 1.1)
	r.rows = append(r.rows, row{
		figure:   "start of `true` against the floor",
		measured: bench.Ms(a),
		baseline: fmt.Sprintf("%s (floor); setsid %s, tini %s", bench.Ms(f), bench.Ms(ss), bench.Ms(t)),
		ratio: fmt.Sprintf("%.2f× floor; %.2f× setsid, %.2f× tini",
			ratio, bench.Median(pairRatios(s[0], s[2])), bench.Median(pairRatios(s[0], s[3]))),
		target: "≤ 1.1× floor", limit: fmt.Sprintf("%.2f", ratio/1.1),
		pass: result,
	})
	r.detail("floor start, agent-wrap `run --no-stream --lease 0 ID -- true`: %s", spread(s[0], bench.Ms))
	r.detail("floor start, phases under agent-wrap: %s", ph.String("fork", "exit"))
	r.detail("floor start, `awfloor ROOT ID true`: %s", spread(s[1], bench.Ms))
	r.detail("floor start, agent-wrap with the default 5m lease (a deadline_epoch file): %s; %.2f× floor", spread(s[4], bench.Ms), bench.Median(s[4])/f)
	r.detail("floor start, per-round ratios agent-wrap/floor: %s; ratio of the medians %.2f×; the floor itself is %.2f× setsid, %.2f× tini",
		fmtRatios(pairRatios(s[0], s[1])), a/f, bench.Median(pairRatios(s[1], s[2])), bench.Median(pairRatios(s[1], s[3])))
	// What the binary's own start accounts for: the per-round difference of
	// the two programs doing nothing, taken off agent-wrap's run.
	var own, gap, less []float64
	for i := range s[0] {
		own = append(own, s[5][i]-s[6][i])
		gap = append(gap, s[0][i]-s[1][i])
		less = append(less, (s[0][i]-own[i])/s[1][i])
	}
	r.detail("floor start, the binaries' own start: `agent-wrap version` %s, `awfloor` (no arguments: usage, exit 64) %s; agent-wrap's own start is %s longer (median of the rounds), of the %s between the runs; without it the run would be %.2f× floor (median of the rounds)",
		spread(s[5], bench.Ms), spread(s[6], bench.Ms), bench.Ms(bench.Median(own)), bench.Ms(bench.Median(gap)), bench.Median(less))
	return nil
}

// floorCancel: TERM to a confirmed, recorded cancel, agent-wrap against the
// floor; and `agent-wrap cancel` against TERM plus one start of the binary.
func (r *runner) floorCancel(fl, root string) error {
	ph := newPhases("cancel_requested", "signal_sent", "final")
	phCmd := newPhases("cancel_requested", "signal_sent", "final")
	awTERM := func() (float64, error) { return r.cancelWith(r.bin, root, false, ph) }
	awCancel := func() (float64, error) { return r.cancelWith(r.bin, root, true, phCmd) }
	version := func() (float64, error) { return r.timed(0, nil, r.bin, "version") }
	phFloor := newPhases("cancel_requested", "final")
	floor := func() (float64, error) { return r.floorCancelOnce(fl, root, phFloor) }
	tini := func() (float64, error) { return r.tiniCancelOnce() }
	s, err := bench.Interleave(1, r.n(30, 7), awTERM, floor, awCancel, version, tini)
	if err != nil {
		return err
	}
	term, f, cmd, ver, t := bench.Median(s[0]), bench.Median(s[1]), bench.Median(s[2]), bench.Median(s[3]), bench.Median(s[4])
	ratio, result := atMost(pairRatios(s[0], s[1]), 1.2)
	r.rows = append(r.rows, row{
		figure:   "TERM to a confirmed, recorded cancel, against the cancel floor",
		measured: bench.Ms(term),
		baseline: fmt.Sprintf("%s (floor); tini %s", bench.Ms(f), bench.Ms(t)),
		ratio:    fmt.Sprintf("%.2f× floor; %.1f× tini", ratio, bench.Median(pairRatios(s[0], s[4]))),
		target:   "≤ 1.2× floor", limit: fmt.Sprintf("%.2f", ratio/1.2),
		pass: result,
	})
	// The command's own rounds: cancel[i] / (TERM[i] + version[i]).
	var sum []float64
	for i := range s[0] {
		sum = append(sum, s[0][i]+s[3][i])
	}
	ratio, result = atMost(pairRatios(s[2], sum), 1.2)
	r.rows = append(r.rows, row{
		figure:   "`agent-wrap cancel`, against TERM plus one `agent-wrap version`",
		measured: bench.Ms(cmd),
		baseline: fmt.Sprintf("%s (TERM %s + version %s); floor %s, tini %s", bench.Ms(term+ver), bench.Ms(term), bench.Ms(ver), bench.Ms(f), bench.Ms(t)),
		ratio: fmt.Sprintf("%.2f×; %.2f× floor, %.1f× tini",
			ratio, bench.Median(pairRatios(s[2], s[1])), bench.Median(pairRatios(s[2], s[4]))),
		target: "≤ 1.2×", limit: fmt.Sprintf("%.2f", ratio/1.2),
		pass: result,
	})
	r.detail("floor cancel, TERM to agent-wrap: %s; phases: %s", spread(s[0], bench.Ms), ph.String("TERM", "exit"))
	r.detail("floor cancel, TERM to awfloor: %s; phases: %s", spread(s[1], bench.Ms), phFloor.String("TERM", "exit"))
	r.detail("floor cancel, `agent-wrap cancel`: %s; phases: %s", spread(s[2], bench.Ms), phCmd.String("cancel started", "exit"))
	r.detail("floor cancel, `agent-wrap version`: %s", spread(s[3], bench.Ms))
	r.detail("floor cancel, per-round ratios TERM/floor: %s (ratio of the medians %.2f×); cancel/(TERM+version): %s (ratio of the medians %.2f×)",
		fmtRatios(pairRatios(s[0], s[1])), term/f, fmtRatios(pairRatios(s[2], sum)), cmd/(term+ver))
	return nil
}

// floorCancelOnce: the cancel tree under awfloor, TERM once it is running,
// until awfloor exits with its final record.
func (r *runner) floorCancelOnce(fl, root string, ph *phases) (float64, error) {
	id := r.id("fc")
	w, err := r.start(nil, nil, false, fl, root, id, "sh", "-c", cancelTree)
	if err != nil {
		return 0, err
	}
	r.onCleanup(func() { r.stopRun(root, id, w) })
	if _, err := waitRunning(root, id, w.pid, twoSleeps); err != nil {
		return 0, fmt.Errorf("floor run %s never had its tree: %w", id, err)
	}
	t0 := time.Now()
	if err := w.pfd.Signal(unix.SIGTERM); err != nil {
		return 0, err
	}
	end, err := w.exited(30 * time.Second)
	if err != nil {
		return 0, err
	}
	if err := w.wait(); err != nil {
		return 0, err
	}
	rec, err := readRecord(root, id)
	if err != nil {
		return 0, err
	}
	if rec.State != statusfile.Cancelled || w.code() != 143 {
		return 0, fmt.Errorf("floor run %s: state %s, exit %d; want cancelled, 143", id, rec.State, w.code())
	}
	ph.add(root, id, t0, end)
	return end.Sub(t0).Seconds(), nil
}

// floorWatchdog is the watchdog figure's hook: at 10,000 runs, the scan
// against reading every status.json, at the floor's tighter target (1.3×).
func (r *runner) floorWatchdog(n int, w, b float64) {
	if n != 10000 {
		return
	}
	r.rows = append(r.rows, row{
		figure:   "watchdog --once over 10000 runs, against reading every status.json",
		measured: bench.Ms(w), baseline: bench.Ms(b) + " (read every status.json)",
		ratio:  fmt.Sprintf("%.2f×", w/b),
		target: "≤ 1.3×", limit: fmt.Sprintf("%.2f", w/b/1.3),
		pass: passIf(w/b <= 1.3),
	})
}

const floorMethods = `- **floor**: ` + "`bin/awfloor ROOT ID CMD`" + ` (bench/cmd/awfloor) does only the
  file work the contract needs around one job: mkdir, events.jsonl kept open
  (a chained line per step), stdout.log and stderr.log, pid and pgid, and
  ` + "`starting`" + `, ` + "`running`" + ` and a final record, each a temp file fsynced and renamed,
  the final one with its directory fsynced; on TERM the intent journaled and
  fsynced, ` + "`cancelling`" + `, TERM to the group, every descendant reaped (as
  subreaper), ` + "`cancelled`" + ` with its directory. Start: agent-wrap ` + "`run --no-stream\n  --lease 0 ID -- true`" + ` against it, setsid and tini in the same rounds, and the
  binaries' own start in those rounds: ` + "`agent-wrap version`" + ` against awfloor with no
  arguments (usage, exit 64), with the start ratio that difference leaves. Cancel:
  the cancel figure's tree and clock, TERM to agent-wrap against TERM to awfloor
  (and tini); ` + "`agent-wrap cancel`" + ` against the same round's TERM sample plus one
  ` + "`agent-wrap version`" + `. Each ratio is the median of the rounds' own ratios, and
  "undecided" when its 95 % confidence interval contains the target. The
  watchdog row at 10,000 runs is the watchdog figure's, against the tighter
  target.
`
