package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
)

// idle: what a run in flight costs its host while its job neither writes
// nor exits, the state most of a host's hundreds of runs are in: the
// wrapper's CPU time and the number of times its threads were scheduled,
// per second, over a window that starts a second after the run is running.
// Side by side, each job a silent `sleep`: a wrapper streaming its logs to
// pipes drained by this process (as under ssh), one with --no-stream, an
// `attach` following the first (what a controller's run has on the host
// beside its wrapper), the `agent-wrap ssh` controller of a run on the
// local sshd, and (the references) coreutils `tail -f` following
// the streaming run's two logs to a pipe, and tini supervising a sleep.
func (r *runner) idle() (err error) {
	defer catchFatal(&err)
	window := 10 * time.Second
	if r.quick {
		window = 4 * time.Second
	}
	root, err := r.newRoot("idle")
	if err != nil {
		return err
	}
	drain := func() (*os.File, error) {
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		go func() { _, _ = io.Copy(io.Discard, pr); pr.Close() }()
		r.onCleanup(func() { pw.Close() })
		return pw, nil
	}
	type side struct {
		name string
		pid  int
		stop func()
	}
	var sides []side
	add := func(name, id string, stream bool) error {
		out, err := drain()
		if err != nil {
			return err
		}
		argv := []string{r.bin, "--root", root, "run", "--lease", "0"}
		if !stream {
			argv = append(argv, "--no-stream")
		}
		argv = append(argv, id, "--", "sleep", "300")
		w, err := r.start(out, out, false, argv...)
		if err != nil {
			return err
		}
		if _, err := waitRunning(root, id, w.pid, nil); err != nil {
			return err
		}
		sides = append(sides, side{name, w.pid, func() { r.stopRun(root, id, w) }})
		return nil
	}
	streamed := r.id("idle")
	if err := add("agent-wrap, logs streamed to pipes (as under ssh)", streamed, true); err != nil {
		return err
	}
	if err := add("agent-wrap --no-stream", r.id("idle-ns"), false); err != nil {
		return err
	}
	runDir := filepath.Join(root, streamed)
	out, err := drain()
	if err != nil {
		return err
	}
	// What a controller's run has on the host beside its wrapper: the
	// `attach` its connection execs after `run --detach`.
	attOut, err := drain()
	if err != nil {
		return err
	}
	att, err := r.start(attOut, attOut, false, r.bin, "--root", root, "attach", "--from", "0,0", streamed)
	if err != nil {
		return err
	}
	sides = append(sides, side{"agent-wrap attach (a controller's reattach) following the streaming run", att.pid, nil})
	// The controller's side: `agent-wrap ssh` of a quiet job to the test
	// sshd, through a ControlMaster of its own (--rsh with a ControlPath,
	// as a user's ssh config would have it), with a 15 s lease (a renewal
	// every 5 s): what a runner pays on its own machine for each run it
	// has in flight.
	srv := sshtest.Start(&benchTB{r: r})
	_, rsh, err := r.sshMaster(srv, "idle-cm")
	if err != nil {
		return err
	}
	ctlID := r.id("idle-ctl")
	ctlOut, err := drain()
	if err != nil {
		return err
	}
	ctl, err := r.start(ctlOut, ctlOut, false, r.bin, "ssh", "--rsh", rsh, "--remote-bin", r.bin, "--remote-root", root,
		"--ledger", filepath.Join(r.scratch, "idle-ledger"), "--id", ctlID, "--lease", "15s", "--grace", "2s", srv.Destination(), "--", "sleep", "300")
	if err != nil {
		return err
	}
	if _, err := waitRecordRunning(root, ctlID); err != nil {
		return fmt.Errorf("the controller's run: %w", err)
	}
	sides = append(sides, side{"agent-wrap ssh (the controller, its own process), lease 15s", ctl.pid, func() {
		_ = ctl.pfd.Signal(unix.SIGINT) // a confirmed cancel, as Ctrl-C
		_, _ = ctl.exited(time.Minute)
	}})
	tail, err := r.start(out, nil, false, "tail", "-q", "-f", filepath.Join(runDir, "stdout.log"), filepath.Join(runDir, "stderr.log"))
	if err != nil {
		return err
	}
	sides = append(sides, side{"tail -f of the streaming run's two logs", tail.pid, nil})
	tini, err := r.start(nil, nil, false, "tini", "-s", "-g", "--", "sleep", "300")
	if err != nil {
		return err
	}
	sides = append(sides, side{"tini -s -g -- sleep", tini.pid, nil})
	defer func() {
		for _, s := range sides {
			if s.stop != nil {
				s.stop()
			}
		}
	}()

	time.Sleep(time.Second) // past the start: the state a run spends its life in
	// Windows in a row, each side's mean reported (a controller's renewal
	// falls in some windows and not others: the mean is what it costs),
	// with the spread of the windows beside it. The figure runs before the
	// big ones: run after the 1000-run scale it measured five times what
	// it did alone.
	windows := r.n(5, 3)
	type totals struct{ cpu, runs float64 }
	samples := make([][]totals, len(sides))
	read := func() ([]totals, error) {
		out := make([]totals, len(sides))
		for i, s := range sides {
			c, n, err := threadTotals(s.pid)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			out[i] = totals{c, n}
		}
		return out, nil
	}
	prev, err := read()
	if err != nil {
		return err
	}
	t0 := time.Now()
	for w := 0; w < windows; w++ {
		time.Sleep(window / time.Duration(windows))
		now, err := read()
		if err != nil {
			return err
		}
		secs := time.Since(t0).Seconds()
		for i := range sides {
			samples[i] = append(samples[i], totals{(now[i].cpu - prev[i].cpu) / secs, (now[i].runs - prev[i].runs) / secs})
		}
		prev, t0 = now, time.Now()
	}
	got := make([]totals, len(sides))
	cpus := make([][]float64, len(sides))
	for i := range sides {
		var runs []float64
		for _, t := range samples[i] {
			cpus[i] = append(cpus[i], t.cpu*1e3)
			runs = append(runs, t.runs)
		}
		got[i] = totals{mean(cpus[i]) / 1e3, mean(runs)}
	}
	per := func(t totals) string {
		return fmt.Sprintf("%.3f ms CPU/s, %.1f wakeups/s", t.cpu*1e3, t.runs)
	}
	refs := fmt.Sprintf("%s (tail -f); %s (tini)", per(got[4]), per(got[5]))
	for i := 0; i < 4; i++ {
		r.rows = append(r.rows, row{
			figure:   "idle run in flight, " + sides[i].name,
			measured: per(got[i]),
			baseline: refs,
			ratio:    fmt.Sprintf("%.1f %% of one CPU at 1000 runs", got[i].cpu*1000*100),
			target:   "—", limit: "—", pass: "n/a",
		})
		r.detail("idle, %s: ms CPU/s in each window %s", sides[i].name,
			spread(cpus[i], func(v float64) string { return fmt.Sprintf("%.3f", v) }))
	}
	r.detail("idle: %d windows of %.1f s, from a second after each run was running, the mean of each side reported; CPU time is the sum over the process's threads of /proc/PID/task/TID/schedstat's run time, wakeups the sum of its timeslice counts", windows, (window / time.Duration(windows)).Seconds())
	return nil
}

// threadTotals sums, over the threads of pid, the CPU time (seconds) and the
// number of times each was scheduled, from /proc/PID/task/*/schedstat.
func threadTotals(pid int) (cpu, runs float64, err error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // a thread that ended meanwhile
		}
		f := bytes.Fields(b)
		if len(f) < 3 {
			return 0, 0, fmt.Errorf("%s/%s/schedstat: %q", dir, t.Name(), b)
		}
		ns, err1 := strconv.ParseFloat(string(f[0]), 64)
		n, err2 := strconv.ParseFloat(string(f[2]), 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("%s/%s/schedstat: %q", dir, t.Name(), b)
		}
		cpu, runs = cpu+ns/1e9, runs+n
	}
	return cpu, runs, nil
}

// waitRecordRunning waits until the run's status.json says running.
func waitRecordRunning(root, id string) (string, error) {
	var state string
	err := bench.WaitUntil(time.Minute, 5*time.Millisecond, func() (bool, error) {
		rec, err := readRecord(root, id)
		if err != nil {
			return false, nil
		}
		state = rec.State
		return state == "running", nil
	})
	return state, err
}

func mean(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
