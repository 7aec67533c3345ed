package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

const mib = 1 << 20

func passIf(ok bool) string {
	if ok {
		return "pass"
	}
	return "FAIL"
}

func spread(xs []float64, unit func(float64) string) string {
	return fmt.Sprintf("n=%d min %s median %s max %s", len(xs), unit(bench.Min(xs)), unit(bench.Median(xs)), unit(bench.Max(xs)))
}

// binary: the size of the static binary, against the 10 MiB limit; Debian's
// tini-static for scale.
func (r *runner) binary() error {
	st, err := os.Stat(r.bin)
	if err != nil {
		return err
	}
	f, err := elf.Open(r.bin)
	if err != nil {
		return err
	}
	defer f.Close()
	static := true
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			static = false
		}
	}
	size := float64(st.Size())
	base, ratio := "-", "-"
	if bs, err := os.Stat("/usr/bin/tini-static"); err == nil {
		base = fmt.Sprintf("%.2f MiB (tini-static)", float64(bs.Size())/mib)
		ratio = fmt.Sprintf("%.1f×", size/float64(bs.Size()))
	}
	limit := 10.0 * mib
	kind := "static"
	if !static {
		kind = "NOT static"
	}
	r.rows = append(r.rows, row{
		figure:   "binary size",
		measured: fmt.Sprintf("%.2f MiB, %s", size/mib, kind),
		baseline: base, ratio: ratio,
		target: "≤ 10 MiB, static",
		limit:  fmt.Sprintf("%.2f", size/limit),
		pass:   passIf(size <= limit && static),
	})
	r.detail("binary: %s, %d bytes, %s (no PT_INTERP, no PT_DYNAMIC: %v)", r.bin, st.Size(), kind, static)
	return nil
}

// startup: a run of `true` from fork to exit, against setsid -w and tini.
func (r *runner) startup() error {
	root, err := r.newRoot("startup")
	if err != nil {
		return err
	}
	ph := newPhases("created", "started", "leader_exited", "final")
	cpu := make([][]float64, 4)
	// withCPU keeps the CPU time (user+sys, with the job) of side i.
	withCPU := func(i int, f func() (float64, error)) func() (float64, error) {
		return func() (float64, error) {
			v, err := f()
			cpu[i] = append(cpu[i], r.cpu())
			return v, err
		}
	}
	aw := withCPU(0, func() (float64, error) {
		id := r.id("startup")
		t0, end, err := r.span(0, nil, r.bin, "--root", root, "run", "--no-stream", "--lease", "0", id, "--", "true")
		ph.add(root, id, t0, end)
		return end.Sub(t0).Seconds(), err
	})
	setsid := withCPU(1, func() (float64, error) { return r.timed(0, nil, "setsid", "-w", "true") })
	tini := withCPU(2, func() (float64, error) { return r.timed(0, nil, "tini", "-s", "-g", "--", "true") })
	sides := []func() (float64, error){aw, setsid, tini}
	if r.alt != "" {
		sides = append(sides, withCPU(3, func() (float64, error) {
			return r.timed(0, nil, r.alt, "--root", root, "run", "--no-stream", "--lease", "0", r.id("startup"), "--", "true")
		}))
	}
	s, err := bench.Interleave(3, r.n(40, 15), sides...)
	if err != nil {
		return err
	}
	if r.alt != "" {
		m := bench.Median(s[3])
		r.detail("startup with -compare %s: %s; %.2f× setsid, %.2f× tini; CPU time median %s",
			r.alt, spread(s[3], bench.Ms), m/bench.Median(s[1]), m/bench.Median(s[2]), bench.Ms(bench.Median(cpu[3])))
	}
	r.detail("startup CPU time (user+sys of the process and what it reaped; less affected by other load than wall time): agent-wrap %s, setsid %s, tini %s",
		bench.Ms(bench.Median(cpu[0])), bench.Ms(bench.Median(cpu[1])), bench.Ms(bench.Median(cpu[2])))
	a, b, c := bench.Median(s[0]), bench.Median(s[1]), bench.Median(s[2])
	for _, x := range []struct {
		name string
		v    float64
	}{{"setsid -w true", b}, {"tini -s -g -- true", c}} {
		r.rows = append(r.rows, row{
			figure:   "startup vs " + strings.Fields(x.name)[0],
			measured: bench.Ms(a), baseline: bench.Ms(x.v) + " (" + x.name + ")",
			ratio:  fmt.Sprintf("%.2f×", a/x.v),
			target: "≤ 3×", limit: fmt.Sprintf("%.2f", a/x.v/3),
			pass: passIf(a/x.v <= 3),
		})
	}
	r.detail("startup `agent-wrap run --no-stream --lease 0 ID -- true`: %s", spread(s[0], bench.Ms))
	r.detail("startup under agent-wrap, medians between the run's journal events: %s", ph.String("fork", "exit"))
	r.detail("startup `setsid -w true`: %s", spread(s[1], bench.Ms))
	r.detail("startup `tini -s -g -- true`: %s", spread(s[2], bench.Ms))
	return nil
}

const cancelTree = "sleep 300 & sleep 300 & wait"

// cancel: from the signal (or the start of `agent-wrap cancel`) to the
// wrapper's exit with its final record written, against tini -s -g being
// TERMed with the same tree.
func (r *runner) cancel() error {
	root, err := r.newRoot("cancel")
	if err != nil {
		return err
	}
	phTERM := newPhases("cancel_requested", "signal_sent", "final")
	phCancel := newPhases("cancel_requested", "signal_sent", "final")
	awTERM := func() (float64, error) { return r.cancelOnce(root, false, phTERM) }
	awCancel := func() (float64, error) { return r.cancelOnce(root, true, phCancel) }
	tini := func() (float64, error) { return r.tiniCancelOnce() }
	sides := []func() (float64, error){awTERM, tini}
	names := []string{"TERM to the wrapper"}
	hasCancel := r.has("cancel")
	version := func() (float64, error) { return r.timed(0, nil, r.bin, "version") }
	if hasCancel {
		// A start of the binary in the same rounds: what `cancel` pays
		// before it can do anything, and TERM does not.
		sides = []func() (float64, error){awTERM, awCancel, version, tini}
		names = append(names, "`agent-wrap cancel`")
	}
	phAlt := newPhases("cancel_requested", "signal_sent", "final")
	if r.alt != "" {
		sides = append(sides, func() (float64, error) { return r.cancelWith(r.alt, root, false, phAlt) })
	}
	s, err := bench.Interleave(1, r.n(20, 7), sides...)
	if err != nil {
		return err
	}
	if r.alt != "" {
		alt := s[len(s)-1]
		s = s[:len(s)-1]
		m := bench.Median(alt)
		r.detail("cancel by TERM with -compare %s: %s; %.1f× tini; phases: %s", r.alt, spread(alt, bench.Ms), m/bench.Median(s[len(s)-1]), phAlt.String("TERM", "exit"))
	}
	t := bench.Median(s[len(s)-1])
	if hasCancel {
		term, cmd, start := bench.Median(s[0]), bench.Median(s[1]), bench.Median(s[2])
		r.detail("cancel, where `agent-wrap cancel` goes beyond TERM: %s in all; one start and exit of the binary (`agent-wrap version`, sampled in the same rounds: %s) %s; the rest, cancel reading, checking and recording the run and waiting for the record, %s",
			bench.Ms(cmd-term), spread(s[2], bench.Ms), bench.Ms(start), bench.Ms(cmd-term-start))
	}
	for i, name := range names {
		m := bench.Median(s[i])
		ok := m <= 0.015 && m/t <= 6
		r.rows = append(r.rows, row{
			figure:   "confirmed cancel, " + name,
			measured: bench.Ms(m), baseline: bench.Ms(t) + " (tini TERMed)",
			ratio:  fmt.Sprintf("%.1f×", m/t),
			target: "≤ 15 ms and ≤ 6× tini",
			limit:  fmt.Sprintf("%.2f", max(m/0.015, m/t/6)),
			pass:   passIf(ok),
		})
		r.detail("cancel, %s: %s", name, spread(s[i], bench.Ms))
	}
	r.detail("cancel by TERM, medians between the run's journal events: %s", phTERM.String("TERM", "exit"))
	if hasCancel {
		r.detail("cancel by `agent-wrap cancel`, medians between the run's journal events: %s", phCancel.String("cancel started", "exit"))
	}
	if !hasCancel {
		r.rows = append(r.rows, row{figure: "confirmed cancel, `agent-wrap cancel`", measured: "not measured: no `cancel` command in this build", pass: "n/a"})
	}
	r.detail("cancel, tini -s -g TERMed: %s", spread(s[len(s)-1], bench.Ms))
	return nil
}

func (r *runner) cancelOnce(root string, viaCommand bool, ph *phases) (float64, error) {
	return r.cancelWith(r.bin, root, viaCommand, ph)
}

func (r *runner) cancelWith(bin, root string, viaCommand bool, ph *phases) (float64, error) {
	id := r.id("cancel")
	w, err := r.start(nil, nil, false, bin, "--root", root, "run", "--no-stream", "--lease", "0", id, "--", "sh", "-c", cancelTree)
	if err != nil {
		return 0, err
	}
	r.onCleanup(func() { r.stopRun(root, id, w) })
	if _, err := waitRunning(root, id, w.pid, twoSleeps); err != nil {
		return 0, fmt.Errorf("run %s never had its tree: %w", id, err)
	}
	t0 := time.Now()
	if viaCommand {
		if _, err := r.timed(0, nil, bin, "--root", root, "cancel", id); err != nil {
			return 0, err
		}
	} else if err := w.pfd.Signal(unix.SIGTERM); err != nil {
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
	if rec.State != statusfile.Cancelled || len(rec.Survivors) != 0 || w.code() != 143 {
		return 0, fmt.Errorf("run %s: state %s, survivors %v, exit %d; want cancelled, none, 143", id, rec.State, rec.Survivors, w.code())
	}
	ph.add(root, id, t0, end)
	return end.Sub(t0).Seconds(), nil
}

// stopRun is the cleanup of a wrapper started by awbench: TERM it if it is
// still there, wait, then KILL whatever is left of the job's group.
func (r *runner) stopRun(root, id string, w *started) {
	if !w.done {
		_ = w.pfd.Signal(unix.SIGTERM)
		if _, err := w.exited(15 * time.Second); err != nil {
			_ = w.pfd.Signal(unix.SIGKILL)
		}
		_ = w.wait()
	}
	rec, err := readRecord(root, id)
	if err == nil && w.done && statusfile.Terminal(rec.State) && rec.Survivors != nil && len(rec.Survivors) == 0 {
		// The wrapper, reaped, recorded that nothing of the run survived:
		// nothing is left, and by now its group number may be another
		// program's.
		return
	}
	if err == nil && rec.PGID > 1 {
		if n := killGroupMembers(rec.PGID, rec.LeaderStart, rec.LeaderStart); n > 0 {
			r.logf("run %s: KILLed %d leftover members of group %d", id, n, rec.PGID)
		}
	}
}

func (r *runner) tiniCancelOnce() (float64, error) {
	t, err := r.start(nil, nil, false, "tini", "-s", "-g", "--", "sh", "-c", cancelTree)
	if err != nil {
		return 0, err
	}
	var ds []proc.Stat
	err = bench.WaitUntil(time.Minute, time.Millisecond, func() (bool, error) {
		ds, err = bench.Descendants(t.pid)
		return err == nil && twoSleeps(ds), err
	})
	if err != nil {
		return 0, fmt.Errorf("tini never had its tree: %w", err)
	}
	pgid, minStart := ds[0].PGID, ds[0].Start
	leader, err := proc.ReadStat(pgid) // tini itself, the leader of its group
	if err != nil {
		return 0, fmt.Errorf("tini's group leader: %w", err)
	}
	confirmed := false // tini exited 143: its tree is gone, nothing to clean up
	r.onCleanup(func() {
		if !confirmed {
			killGroupMembers(pgid, leader.Start, minStart)
		}
	})
	t0 := time.Now()
	if err := t.pfd.Signal(unix.SIGTERM); err != nil {
		return 0, err
	}
	end, err := t.exited(30 * time.Second)
	if err != nil {
		return 0, err
	}
	if err := t.wait(); err != nil {
		return 0, err
	}
	if t.code() != 143 {
		return 0, fmt.Errorf("tini exited %d, want 143", t.code())
	}
	confirmed = true
	return end.Sub(t0).Seconds(), nil
}

// pairRatios is num[i]/den[i] for each round i.
func pairRatios(num, den []float64) []float64 {
	out := make([]float64, 0, len(num))
	for i := range num {
		if i < len(den) && den[i] > 0 {
			out = append(out, num[i]/den[i])
		}
	}
	return out
}

func fmtRatios(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(parts, " ")
}

// warmPageCache writes size bytes to a scratch file in dir and removes it,
// so the page cache's next size bytes come from pages freed just now.
func warmPageCache(dir string, size int64) error {
	f, err := os.CreateTemp(dir, "warm-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n := int64(0); n < size; n += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-n)]); err != nil {
			return err
		}
	}
	return nil
}

// output: the job writes SIZE bytes to stdout; under agent-wrap its fd 1 is
// stdout.log and the wrapper streams that to /dev/null. Baseline: the same
// job with fd 1 a file in the same run root.
func (r *runner) output() error {
	size := int64(1 << 30)
	if r.quick {
		size = 64 << 20
	}
	if v := os.Getenv("BENCH_OUTPUT_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("BENCH_OUTPUT_BYTES=%q: not a positive number of bytes", v)
		}
		size = n
	}
	root, err := r.newRoot("output")
	if err != nil {
		return err
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	sz := strconv.FormatInt(size, 10)
	// Each sample starts from the same memory state: SIZE bytes of page
	// cache written and freed just before it. Without this the time of the
	// job alone moves by 2x, with whether the host still backs the guest
	// pages the page cache gets (virtio-balloon free page reporting returns
	// pages freed 2 s ago to the host; touching them again faults there):
	// 1.0-2.4 s for the same 1 GiB write here, back to back.
	warm := func() error { return warmPageCache(root, size) }
	// wrapped: the job under agent-wrap bin with extra run flags; every
	// sample checks that stdout.log holds every byte.
	wrapped := func(bin string, extra ...string) func() (float64, error) {
		return func() (float64, error) {
			if err := warm(); err != nil {
				return 0, err
			}
			id := r.id("out")
			argv := append([]string{bin, "--root", root, "run", "--lease", "0"}, extra...)
			argv = append(argv, id, "--", "head", "-c", sz, "/dev/zero")
			dt, err := r.timed(0, devnull, argv...)
			if err != nil {
				return 0, err
			}
			st, err := os.Stat(filepath.Join(root, id, rundir.StdoutFile))
			if err != nil {
				return 0, err
			}
			if st.Size() != size {
				return 0, fmt.Errorf("stdout.log has %d bytes, want %d", st.Size(), size)
			}
			return dt, os.RemoveAll(filepath.Join(root, id))
		}
	}
	// directWith: the job writes the file directly while helper (if any)
	// runs beside it; the helper is stopped by its PID once the job is
	// done. Two helpers are references, not targets: coreutils `tail -f`
	// following the file to /dev/null (what any live follower costs here),
	// and a shell spinning on the other CPU, touching no file at all
	// (what this VM charges a page-cache writer for a busy second vCPU).
	directWith := func(helper ...string) func() (float64, error) {
		return func() (float64, error) {
			if err := warm(); err != nil {
				return 0, err
			}
			p := filepath.Join(root, r.id("direct")+".out")
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_EXCL, 0o600)
			if err != nil {
				return 0, err
			}
			defer os.Remove(p)
			defer f.Close()
			var h *started
			if len(helper) > 0 {
				argv := append([]string(nil), helper...)
				for i, a := range argv {
					if a == "FILE" {
						argv[i] = p
					}
				}
				if h, err = r.start(devnull, nil, false, argv...); err != nil {
					return 0, err
				}
			}
			dt, err := r.timed(0, f, "head", "-c", sz, "/dev/zero")
			if h != nil {
				_ = h.pfd.Signal(unix.SIGKILL)
				if _, werr := h.exited(30 * time.Second); werr != nil && err == nil {
					err = werr
				}
				_ = h.wait()
			}
			return dt, err
		}
	}
	const (
		iAW = iota
		iDirect
		iNoStream
		iTail
		iSpin
		iAlt
	)
	sides := []func() (float64, error){wrapped(r.bin), directWith(), wrapped(r.bin, "--no-stream"),
		directWith("tail", "-c", "+1", "-f", "FILE"),
		directWith("sh", "-c", "while :; do :; done")}
	if r.alt != "" {
		sides = append(sides, wrapped(r.alt))
	}
	// Rotated: the side after agent-wrap's always started just after a
	// run directory with 1 GiB of log was removed, and in one run that
	// side was the slow one (a median of 1952 ms against 1116-1500 ms for
	// the others).
	s, err := bench.InterleaveRotating(1, r.n(15, 3), sides...)
	if err != nil {
		return err
	}
	if r.alt != "" {
		r.detail("output with -compare %s: %s; throughput ratio %.3f× (median of the per-round ratios)", r.alt, spread(s[iAlt], bench.Ms), bench.Median(pairRatios(s[iDirect], s[iAlt])))
	}
	a, b := bench.Median(s[iAW]), bench.Median(s[iDirect])
	mbps := func(t float64) string { return fmt.Sprintf("%.0f MiB/s", float64(size)/mib/t) }
	// The ratio is the median of the rounds' own ratios (baseline time
	// over agent-wrap time, the two sampled back to back), not the ratio
	// of the two medians: a slow spell of the host's memory (see warm)
	// lands on single samples, and a median of per-round ratios keeps
	// those rounds out of the middle, where a median of each side lets
	// them in on one side and not the other.
	//
	// When the 95 % confidence interval of that median (order statistics
	// of the rounds, bench.MedianCI) contains the target, the run cannot
	// tell a pass from a miss and says so instead of letting the noise
	// decide.
	ratios := pairRatios(s[iDirect], s[iAW])
	ratio := bench.Median(ratios)
	lo, hi := bench.MedianCI(ratios)
	result := passIf(ratio >= 0.95)
	if lo < 0.95 && 0.95 < hi {
		result = fmt.Sprintf("undecided: the median's 95 %% interval %.2f-%.2f contains the target", lo, hi)
	}
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("output, %s to stdout, streamed to /dev/null", humanBytes(size)),
		measured: mbps(a), baseline: mbps(b) + " (job writes the file)",
		ratio:  fmt.Sprintf("%.3f×", ratio),
		target: "≥ 0.95×", limit: fmt.Sprintf("%.2f", 0.95/ratio),
		pass: result,
	})
	r.detail("output: per-round throughput ratios %s; ratio of the medians %.3f×, of the minimums %.3f×", fmtRatios(pairRatios(s[iDirect], s[iAW])), b/a, bench.Min(s[iDirect])/bench.Min(s[iAW]))
	r.detail("output under agent-wrap (wall time of the run): %s", spread(s[iAW], bench.Ms))
	r.detail("output, job writes the file: %s", spread(s[iDirect], bench.Ms))
	r.detail("output under agent-wrap --no-stream (the job writes stdout.log, nothing reads it): %s; throughput ratio %.3f×", spread(s[iNoStream], bench.Ms), bench.Median(pairRatios(s[iDirect], s[iNoStream])))
	r.detail("output, reference: job writes the file while `tail -c +1 -f` follows it to /dev/null: %s; throughput ratio %.3f× (job time only)", spread(s[iTail], bench.Ms), bench.Median(pairRatios(s[iDirect], s[iTail])))
	r.detail("output, reference: job writes the file while a shell loop spins on the other CPU: %s; throughput ratio %.3f×", spread(s[iSpin], bench.Ms), bench.Median(pairRatios(s[iDirect], s[iSpin])))
	return nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= mib && n%mib == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// memory: the wrapper's VmHWM (its own peak RSS, not the job's) while it
// supervises a job that streams 100 MB over 10 s; tini under the same job
// for scale.
func (r *runner) memory() error {
	rounds, chunk := 10, 10_000_000
	if r.quick {
		rounds = 3
	}
	job := fmt.Sprintf("i=0; while [ $i -lt %d ]; do head -c %d /dev/zero; sleep 1; i=$((i+1)); done", rounds, chunk)
	root, err := r.newRoot("memory")
	if err != nil {
		return err
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	var anon, tiniAnon []float64
	var mu sync.Mutex
	peak := func(argv ...string) (float64, error) {
		p, err := r.start(devnull, nil, false, argv...)
		if err != nil {
			return 0, err
		}
		var hwm, an int64
		for {
			if v, err := bench.VmHWM(p.pid); err == nil && v > hwm {
				hwm = v
			}
			if v, err := bench.StatusBytes(p.pid, "RssAnon"); err == nil && v > an {
				an = v
			}
			if _, err := p.pfd.Wait(10 * time.Millisecond); err == nil {
				break
			} else if !errors.Is(err, bench.ErrTimeout) {
				return 0, err
			}
		}
		if err := p.wait(); err != nil {
			return 0, err
		}
		if p.code() != 0 {
			return 0, fmt.Errorf("%v exited %d", argv, p.code())
		}
		mu.Lock()
		if argv[0] == r.bin {
			anon = append(anon, float64(an))
		} else {
			tiniAnon = append(tiniAnon, float64(an))
		}
		mu.Unlock()
		return float64(hwm), nil
	}
	// Peak memory does not depend on timing, so both sides of a round run
	// at the same time: the figure takes 10 s a round, not 20.
	var s [2][]float64
	for i := 0; i < r.n(2, 1); i++ {
		var wg sync.WaitGroup
		var a, b float64
		var ea, eb error
		id := r.id("mem")
		wg.Add(2)
		go func() {
			defer wg.Done()
			a, ea = peak(r.bin, "--root", root, "run", "--lease", "0", id, "--", "sh", "-c", job)
		}()
		go func() { defer wg.Done(); b, eb = peak("tini", "-s", "-g", "--", "sh", "-c", job) }()
		wg.Wait()
		if err := errors.Join(ea, eb); err != nil {
			return err
		}
		s[0], s[1] = append(s[0], a), append(s[1], b)
	}
	a, b := bench.Max(s[0]), bench.Max(s[1])
	mb := func(v float64) string { return fmt.Sprintf("%.2f MiB", v/mib) }
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("memory, wrapper VmHWM, %d MB streamed over %d s", rounds*chunk/1_000_000, rounds),
		measured: mb(a), baseline: mb(b) + " (tini)",
		ratio:  fmt.Sprintf("%.1f×", a/b),
		target: "≤ 3 MiB", limit: fmt.Sprintf("%.2f", a/(3*mib)),
		pass: passIf(a <= 3*mib),
	})
	// The per-run cost: private memory. The rest of VmHWM is the binary's
	// own pages, resident from before main and shared by every wrapper
	// through the page cache (the scale figure adds up Pss over 1000).
	pa, pb := bench.Max(anon), bench.Max(tiniAnon)
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("memory, wrapper peak private memory (RssAnon), %d MB streamed over %d s", rounds*chunk/1_000_000, rounds),
		measured: mb(pa), baseline: mb(pb) + " (tini)",
		ratio:  fmt.Sprintf("%.1f×", pa/pb),
		target: "≤ 3 MiB", limit: fmt.Sprintf("%.2f", pa/(3*mib)),
		pass: passIf(pa <= 3*mib),
	})
	floor, err := r.startRSS(root)
	if err != nil {
		return fmt.Errorf("the binary's start: %w", err)
	}
	r.detail("memory, the binary's start without the run path: VmHWM of `agent-wrap wait --timeout 1s` on a live run %s; the wrapper's VmHWM is %s more. Most of the binary's pages are resident before main (the runtime and every package's init touch them, and the kernel maps 64 KiB around each fault)",
		spread(floor, mb), mb(a-bench.Median(floor)))
	r.detail("memory, agent-wrap VmHWM (largest of the samples is reported): %s", spread(s[0], mb))
	r.detail("memory, agent-wrap peak RssAnon (private memory; the rest of VmHWM is the binary's own pages, shared by every wrapper through the page cache): %s", spread(anon, mb))
	r.detail("memory, tini VmHWM: %s; peak RssAnon %s", spread(s[1], mb), spread(tiniAnon, mb))
	return nil
}

// startRSS is the peak RSS of the binary's start, without the run path:
// VmHWM of `agent-wrap wait --timeout 1s` on a live run (another command
// of the same binary, which starts and then only waits), sampled as the
// wrapper's is, 3 times.
func (r *runner) startRSS(root string) ([]float64, error) {
	id := r.id("memwait")
	w, err := r.start(nil, nil, false, r.bin, "--root", root, "run", "--no-stream", "--lease", "0", id, "--", "sleep", "300")
	if err != nil {
		return nil, err
	}
	defer r.stopRun(root, id, w)
	if _, err := waitRunning(root, id, w.pid, nil); err != nil {
		return nil, err
	}
	var out []float64
	for i := 0; i < 3; i++ {
		p, err := r.start(nil, nil, false, r.bin, "--root", root, "wait", "--timeout", "1s", id)
		if err != nil {
			return nil, err
		}
		var hwm int64
		for {
			if v, err := bench.VmHWM(p.pid); err == nil && v > hwm {
				hwm = v
			}
			if _, err := p.pfd.Wait(10 * time.Millisecond); err == nil {
				break
			} else if !errors.Is(err, bench.ErrTimeout) {
				return nil, err
			}
		}
		if err := p.wait(); err != nil {
			return nil, err
		}
		if p.code() != 75 {
			return nil, fmt.Errorf("wait --timeout 1s on a live run exited %d, want 75", p.code())
		}
		out = append(out, float64(hwm))
	}
	return out, nil
}

// watchdog: `watchdog --once` over a root of N runs (100 live, the rest
// finished) against reading every status.json once, at 1k, 10k and 50k.
func (r *runner) watchdog() error {
	scales := []int{1000, 10000, 50000}
	if r.quick {
		scales = []int{1000, 10000}
	}
	const live = 100
	root, err := r.newRoot("watchdog")
	if err != nil {
		return err
	}
	fx, err := r.liveRefs()
	if err != nil {
		return err
	}
	fx.Root, err = rundir.OpenRoot(root, false)
	if err != nil {
		return err
	}
	defer fx.Root.Close()
	// The fixture is hundreds of thousands of files: remove it after the
	// figure and write back what is left, so no later figure pays for it.
	r.onCleanup(func() {
		os.RemoveAll(root)
		unix.Sync()
	})
	t0 := time.Now()
	if err := fx.Write("live", 0, live, true); err != nil {
		return err
	}
	hasWatchdog := r.has("watchdog")
	have := live
	var ratios []float64
	type point struct {
		n    int
		w, b float64
	}
	var pts []point
	for _, n := range scales {
		if err := fx.Write("done", have-live, n-live, false); err != nil {
			return err
		}
		have = n
		// Write the fixture back now: its writeback is no part of a scan.
		unix.Sync()
		r.logf("   fixture of %d runs ready after %.1fs", n, time.Since(t0).Seconds())
		samples := r.n(5, 3)
		if n >= 50000 {
			samples = 3
		}
		base := func() (float64, error) { return r.timed(0, nil, r.self, "readall", root) }
		if !hasWatchdog {
			s, err := bench.Interleave(1, samples, base)
			if err != nil {
				return err
			}
			r.detail("watchdog baseline at %d runs (read every status.json): %s", n, spread(s[0], bench.Ms))
			r.rows = append(r.rows, row{figure: fmt.Sprintf("watchdog scan, %d runs", n),
				measured: "not measured: no `watchdog` command in this build",
				baseline: bench.Ms(bench.Median(s[0])) + " (read every status.json)", target: "≤ 1.5×", pass: "n/a"})
			continue
		}
		var out []byte
		watchdog := func(bin string) func() (float64, error) {
			return func() (float64, error) {
				outf, err := os.CreateTemp(r.scratch, "watchdog-*.out")
				if err != nil {
					return 0, err
				}
				defer os.Remove(outf.Name())
				defer outf.Close()
				dt, err := r.timed(0, outf, bin, "--root", root, "watchdog", "--once")
				if err != nil {
					return 0, err
				}
				out, _ = os.ReadFile(outf.Name())
				return dt, nil
			}
		}
		sides := []func() (float64, error){watchdog(r.bin), base}
		if r.alt != "" {
			sides = append(sides, watchdog(r.alt))
		}
		s, err := bench.Interleave(1, samples, sides...)
		if err != nil {
			return err
		}
		if r.alt != "" {
			r.detail("watchdog --once at %d runs with -compare %s: %s; %.2f× the baseline", n, r.alt, spread(s[2], bench.Ms), bench.Median(s[2])/bench.Median(s[1]))
		}
		if len(strings.TrimSpace(string(out))) > 0 {
			r.detail("watchdog at %d runs printed actions (it should have none): %.300q", n, out)
		}
		if err := r.checkLiveRefs(fx); err != nil {
			return fmt.Errorf("after the watchdog at %d runs: %w", n, err)
		}
		w, b := bench.Median(s[0]), bench.Median(s[1])
		ratios = append(ratios, w/b)
		pts = append(pts, point{n, w, b})
		r.rows = append(r.rows, row{
			figure:   fmt.Sprintf("watchdog --once, %d runs (%d live)", n, live),
			measured: bench.Ms(w), baseline: bench.Ms(b) + " (read every status.json)",
			ratio:  fmt.Sprintf("%.2f×", w/b),
			target: "≤ 1.5×", limit: fmt.Sprintf("%.2f", w/b/1.5),
			pass: passIf(w/b <= 1.5),
		})
		r.floorWatchdog(n, w, b)
		r.detail("watchdog --once at %d runs: %s", n, spread(s[0], bench.Ms))
		r.detail("read every status.json at %d runs: %s", n, spread(s[1], bench.Ms))
	}
	if len(pts) >= 2 {
		// Flat in finished runs: the cost of one more finished run, for the
		// watchdog and for the baseline, between the smallest and the
		// largest fixture; the ratio must not grow with N.
		a, z := pts[0], pts[len(pts)-1]
		dn := float64(z.n - a.n)
		sw, sb := (z.w-a.w)/dn, (z.b-a.b)/dn
		flat := bench.Max(ratios) <= 1.5 && bench.Max(ratios)/bench.Min(ratios) <= 1.3
		r.rows = append(r.rows, row{
			figure:   fmt.Sprintf("watchdog, cost per finished run (%d→%d runs)", a.n, z.n),
			measured: fmt.Sprintf("%.1f µs", sw*1e6), baseline: fmt.Sprintf("%.1f µs (read)", sb*1e6),
			ratio:  fmt.Sprintf("%.2f×", sw/sb),
			target: "flat: ratio ≤ 1.5× at every N, spread ≤ 1.3×", limit: fmt.Sprintf("%.2f", bench.Max(ratios)/1.5),
			pass: passIf(flat),
		})
	}
	return nil
}

// liveRefs starts the processes the live fixture runs point at: a leader
// alone in its session and a stand-in wrapper, both `sleep 3600`; and a
// process that has exited and been reaped, for the finished runs.
func (r *runner) liveRefs() (*bench.Fixture, error) {
	boot, err := proc.BootID()
	if err != nil {
		return nil, err
	}
	fx := &bench.Fixture{BootID: boot}
	leader, err := r.start(nil, nil, true, "sleep", "3600")
	if err != nil {
		return nil, err
	}
	wrapper, err := r.start(nil, nil, false, "sleep", "3600")
	if err != nil {
		return nil, err
	}
	dead, err := r.start(nil, nil, false, "sleep", "3600")
	if err != nil {
		return nil, err
	}
	for _, x := range []struct {
		p  *started
		to *proc.Stat
	}{{leader, &fx.Leader}, {wrapper, &fx.Wrapper}, {dead, &fx.Dead}} {
		err := bench.WaitUntil(time.Minute, time.Millisecond, func() (bool, error) {
			st, err := proc.ReadStat(x.p.pid)
			*x.to = st
			return err == nil && st.Comm == "sleep", err
		})
		if err != nil {
			return nil, err
		}
	}
	_ = dead.pfd.Signal(unix.SIGKILL)
	if _, err := dead.exited(5 * time.Second); err != nil {
		return nil, err
	}
	if err := dead.wait(); err != nil {
		return nil, err
	}
	r.detail("watchdog fixture: live runs name leader %d (sleep, own session) and wrapper %d (sleep); finished runs name %d (exited, reaped); no agent-wrap supervises them",
		fx.Leader.PID, fx.Wrapper.PID, fx.Dead.PID)
	return fx, nil
}

func (r *runner) checkLiveRefs(fx *bench.Fixture) error {
	for _, p := range []proc.Stat{fx.Leader, fx.Wrapper} {
		st, err := proc.ReadStat(p.PID)
		if err != nil || st.Start != p.Start || st.Dead() {
			return fmt.Errorf("process %d of a live run is gone: the watchdog stopped a run whose lease had not passed", p.PID)
		}
	}
	return nil
}

// lease: from the deadline in deadline_epoch to the leader's death, seen
// through a pidfd, for `--lease 2s` runs; each paired with `timeout 2 sleep
// 300` started at the same moment.
func (r *runner) lease() error {
	root, err := r.newRoot("lease")
	if err != nil {
		return err
	}
	n := r.n(10, 3)
	unix.Sync()
	ph := newPhases("deadline_expired", "signal_sent")
	var aw, base []float64
	for i := 0; i < n; i++ {
		var wg sync.WaitGroup
		var a, b float64
		var ea, eb error
		wg.Add(2)
		go func() { defer wg.Done(); a, ea = r.leaseOnce(root, ph) }()
		go func() { defer wg.Done(); b, eb = r.timeoutOnce() }()
		wg.Wait()
		if err := errors.Join(ea, eb); err != nil {
			return err
		}
		aw, base = append(aw, a), append(base, b)
	}
	m, x := bench.Median(aw), bench.Max(aw)
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("lease lateness, deadline to leader dead (%d runs)", n),
		measured: fmt.Sprintf("median %s, max %s", bench.Ms(m), bench.Ms(x)),
		baseline: fmt.Sprintf("median %s, max %s (timeout 2)", bench.Ms(bench.Median(base)), bench.Ms(bench.Max(base))),
		ratio:    "-",
		target:   "median and max ≤ 1.5 s", limit: fmt.Sprintf("%.3f", x/1.5),
		pass: passIf(m <= 1.5 && x <= 1.5),
	})
	r.detail("lease lateness under agent-wrap: %s", spread(aw, bench.Ms))
	r.detail("lease lateness under agent-wrap, medians between the run's journal events: %s", ph.String("deadline", "leader dead"))
	if len(r.leaseWorst) > 0 {
		r.detail("lease lateness, the latest run: %s", r.leaseWorst)
	}
	r.detail("lease lateness of `timeout 2 sleep 300` (from its start + 2 s): %s", spread(base, bench.Ms))
	return nil
}

func (r *runner) leaseOnce(root string, ph *phases) (float64, error) {
	id := r.id("lease")
	w, err := r.start(nil, nil, false, r.bin, "--root", root, "run", "--no-stream", "--lease", "2s", id, "--", "sleep", "300")
	if err != nil {
		return 0, err
	}
	r.onCleanup(func() { r.stopRun(root, id, w) })
	rec, err := waitRunning(root, id, w.pid, func(ds []proc.Stat) bool { return bench.CountComm(ds, "sleep") == 1 })
	if err != nil {
		return 0, err
	}
	leader, err := bench.OpenPidfd(rec.PID, rec.LeaderStart)
	if err != nil {
		return 0, err
	}
	defer leader.Close()
	b, err := os.ReadFile(filepath.Join(root, id, rundir.DeadlineFile))
	if err != nil {
		return 0, err
	}
	dl, err := lease.ParseDeadline(b)
	if err != nil {
		return 0, err
	}
	died, err := leader.Wait(time.Until(time.Unix(dl, 0)) + 20*time.Second)
	if err != nil {
		return 0, err
	}
	if _, err := w.exited(30 * time.Second); err != nil {
		return 0, err
	}
	if err := w.wait(); err != nil {
		return 0, err
	}
	if w.code() != statusfile.ExitLease {
		return 0, fmt.Errorf("run %s exited %d, want %d", id, w.code(), statusfile.ExitLease)
	}
	late := died.Sub(time.Unix(dl, 0)).Seconds()
	ph.add(root, id, time.Unix(dl, 0), died)
	if late > r.leaseLatest {
		one := newPhases("deadline_expired", "signal_sent")
		one.add(root, id, time.Unix(dl, 0), died)
		r.leaseLatest, r.leaseWorst = late, fmt.Sprintf("%s late: %s", bench.Ms(late), one.String("deadline", "leader dead"))
	}
	return late, nil
}

func (r *runner) timeoutOnce() (float64, error) {
	t0 := time.Now()
	t, err := r.start(nil, nil, false, "timeout", "2", "sleep", "300")
	if err != nil {
		return 0, err
	}
	var ds []proc.Stat
	err = bench.WaitUntil(time.Minute, time.Millisecond, func() (bool, error) {
		ds, err = bench.Descendants(t.pid)
		return err == nil && bench.CountComm(ds, "sleep") == 1, err
	})
	if err != nil {
		return 0, err
	}
	child, err := bench.OpenPidfd(ds[0].PID, ds[0].Start)
	if err != nil {
		return 0, err
	}
	defer child.Close()
	died, err := child.Wait(30 * time.Second)
	if err != nil {
		return 0, err
	}
	if _, err := t.exited(10 * time.Second); err != nil {
		return 0, err
	}
	if err := t.wait(); err != nil {
		return 0, err
	}
	return died.Sub(t0.Add(2 * time.Second)).Seconds(), nil
}
