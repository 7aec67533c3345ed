package main

// The idlescale figure: what N quiet runs cost on an unprivileged account,
// the common case over ssh (a session scope is not delegated, so the
// wrapper has no cgroup). N runs of `run --detach --cgroup off --lease 10m
// --no-stream -- sleep 600` are started as a second user (awbench, made
// with useradd when missing), for N = 10, 100 and 500 (10 and 100 with
// -quick); once all are running and a settling second has passed, the CPU
// time of every wrapper (the sum over its threads of schedstat's run time)
// is taken over a window, and each wrapper's private memory (RssAnon) and
// Pss. The baseline is the same figure at N = 10 in the same run: the goal
// is a per-wrapper cost that does not grow with the host, at most 1.2× at
// N = 500 what it is at N = 10, and at most 0.3 ms CPU/s a wrapper. The
// memory floor is bin/idlefloor (bench/cmd/idlefloor: agent-wrap's
// packages linked and initialised, its signals subscribed, nothing run),
// 10 of them as the bench user with GOMAXPROCS=1 as a detached supervisor
// has it, beside no wrapper: what no wrapper can keep less than.

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
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

const benchUser = "awbench"

// idleAt is one N's measurement, per wrapper.
type idleAt struct {
	n                 int
	cpu               float64 // ms CPU per second, the mean over the wrappers
	wakeups           float64 // times scheduled per second
	rssAnon, pss      float64 // bytes
	startAll, stopAll time.Duration
	escapes           []float64 // seconds from a quiet job's escape to its `escaped` line
}

func (r *runner) idleScale() (err error) {
	defer catchFatal(&err)
	uid, gid, err := ensureBenchUser()
	if err != nil {
		return err
	}
	ns := []int{10, 100, 500}
	window := 10 * time.Second
	if r.quick {
		ns, window = []int{10, 100}, 5*time.Second
	}
	floorAnon, floorPss, err := r.idleFloor(10, uid, gid)
	if err != nil {
		return err
	}
	var got []idleAt
	for _, n := range ns {
		m, err := r.idleScaleAt(n, window, uid, gid)
		if err != nil {
			return fmt.Errorf("N = %d: %w", n, err)
		}
		got = append(got, m)
	}
	base := got[0]
	mb := func(v float64) string { return fmt.Sprintf("%.2f MiB", v/mib) }
	for _, m := range got[1:] {
		ratio := m.cpu / base.cpu
		r.rows = append(r.rows, row{
			figure:   fmt.Sprintf("idle scale, CPU per quiet wrapper at N = %d, second user, --cgroup off", m.n),
			measured: fmt.Sprintf("%.3f ms CPU/s, %.1f wakeups/s", m.cpu, m.wakeups),
			baseline: fmt.Sprintf("%.3f ms CPU/s, %.1f wakeups/s (N = %d)", base.cpu, base.wakeups, base.n),
			ratio:    fmt.Sprintf("%.2f×", ratio),
			target:   "≤ 1.2×", limit: fmt.Sprintf("%.2f", ratio/1.2),
			pass: passIf(ratio <= 1.2),
		})
	}
	r.rows = append(r.rows, row{
		figure:   "idle scale, memory floor: bin/idlefloor (agent-wrap's packages, initialised, idle), 10 as the second user, GOMAXPROCS=1",
		measured: fmt.Sprintf("RssAnon %s, Pss %s", mb(floorAnon), mb(floorPss)),
		baseline: "-", ratio: "-", target: "reported", limit: "-", pass: "n/a",
	})
	for _, m := range got {
		r.rows = append(r.rows, row{
			figure:   fmt.Sprintf("idle scale, CPU per quiet wrapper at N = %d (absolute)", m.n),
			measured: fmt.Sprintf("%.3f ms CPU/s", m.cpu),
			baseline: "-", ratio: "-",
			target: "≤ 0.3 ms CPU/s", limit: fmt.Sprintf("%.2f", m.cpu/0.3),
			pass: passIf(m.cpu <= 0.3),
		})
		r.rows = append(r.rows, row{
			figure:   fmt.Sprintf("idle scale, memory per quiet wrapper at N = %d: private (RssAnon), Pss", m.n),
			measured: fmt.Sprintf("RssAnon %s, Pss %s", mb(m.rssAnon), mb(m.pss)),
			baseline: fmt.Sprintf("RssAnon %s (the floor, bin/idlefloor)", mb(floorAnon)),
			ratio:    fmt.Sprintf("%.2f× floor", m.rssAnon/floorAnon),
			target:   "RssAnon ≤ 1.0 MiB; Pss ≤ 1.5 MiB", limit: fmt.Sprintf("%.2f", max(m.rssAnon/mib, m.pss/(1.5*mib))),
			pass: passIf(m.rssAnon <= mib && m.pss <= 1.5*mib),
		})
		r.detail("idle scale, N = %d: an escape after a quiet spell journaled after %s (5 probe runs beside the N)", m.n, spread(m.escapes, func(v float64) string { return fmt.Sprintf("%.2f s", v) }))
		r.detail("idle scale, N = %d: all running %.2f s after the first start, every cancel confirmed %.2f s after the first; per wrapper over %v: %.3f ms CPU/s, %.2f wakeups/s, RssAnon %s, Pss %s",
			m.n, m.startAll.Seconds(), m.stopAll.Seconds(), window, m.cpu, m.wakeups, mb(m.rssAnon), mb(m.pss))
	}
	return nil
}

// idleScaleAt starts n quiet runs as the bench user, measures them, and
// cancels them all.
func (r *runner) idleScaleAt(n int, window time.Duration, uid, gid uint32) (idleAt, error) {
	m := idleAt{n: n}
	root := filepath.Join(r.scratch, fmt.Sprintf("idlescale-%d", n))
	if err := os.Mkdir(root, 0o700); err != nil {
		return m, err
	}
	if err := os.Chown(root, int(uid), int(gid)); err != nil {
		return m, err
	}
	// The scratch directory is root's (0700): the bench user may pass.
	if err := os.Chmod(r.scratch, 0o711); err != nil {
		return m, err
	}
	as := func(args ...string) *exec.Cmd {
		c := exec.Command(r.bin, append([]string{"--root", root}, args...)...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}, Setpgid: true}
		c.Dir = "/"
		return c
	}
	ids := make([]string, n)
	r.onCleanup(func() {
		// Whatever is still running: cancel by ID, the contract's own way.
		for _, id := range ids {
			if rec, err := readRecord(root, id); err == nil && !statusfile.Terminal(rec.State) {
				_ = as("cancel", "--wait", "10s", id).Run()
			}
		}
	})
	t0 := time.Now()
	// Started in batches of 20 `run --detach` at once, each waited for: a
	// detached start answers once its run is running.
	for i := 0; i < n; i += 20 {
		var cs []*exec.Cmd
		var outs []*strings.Builder
		for j := i; j < min(i+20, n); j++ {
			ids[j] = fmt.Sprintf("quiet-%04d", j)
			c := as("run", "--detach", "--cgroup", "off", "--lease", "10m", "--no-stream", ids[j], "--", "sleep", "600")
			out := &strings.Builder{}
			c.Stdout, c.Stderr = out, out
			if err := c.Start(); err != nil {
				return m, err
			}
			cs, outs = append(cs, c), append(outs, out)
		}
		for k, c := range cs {
			if err := c.Wait(); err != nil {
				return m, fmt.Errorf("run --detach %s: %v: %s", ids[i+k], err, outs[k])
			}
		}
	}
	pids := make([]int, n)
	for i, id := range ids {
		rec, err := readRecord(root, id)
		if err != nil {
			return m, err
		}
		if rec.State != statusfile.Running || rec.WrapperPID <= 1 || rec.Cgroup != "" {
			return m, fmt.Errorf("run %s: state %s, wrapper %d, cgroup %q; want running, a wrapper, no cgroup", id, rec.State, rec.WrapperPID, rec.Cgroup)
		}
		pids[i] = rec.WrapperPID
	}
	m.startAll = time.Since(t0)
	time.Sleep(time.Second) // the first looks after the start settle

	sample := func() (cpu, runs float64, err error) {
		for _, pid := range pids {
			c, w, err := threadTotals(pid)
			if err != nil {
				return 0, 0, fmt.Errorf("wrapper %d: %w", pid, err)
			}
			cpu, runs = cpu+c, runs+w
		}
		return cpu, runs, nil
	}
	c0, w0, err := sample()
	if err != nil {
		return m, err
	}
	w := time.Now()
	time.Sleep(window)
	c1, w1, err := sample()
	if err != nil {
		return m, err
	}
	secs := time.Since(w).Seconds()
	m.cpu = (c1 - c0) / secs / float64(n) * 1e3
	m.wakeups = (w1 - w0) / secs / float64(n)
	for _, pid := range pids {
		anon, err := bench.StatusBytes(pid, "RssAnon")
		if err != nil {
			return m, err
		}
		pss, err := bench.RollupBytes(pid, "Pss")
		if err != nil {
			return m, err
		}
		m.rssAnon += float64(anon) / float64(n)
		m.pss += float64(pss) / float64(n)
	}

	// How promptly an escape is journaled after a quiet spell: probe
	// runs whose job sleeps in open(2) of a FIFO until the bench writes
	// to it, then leaves its session (setsid). From the write to the
	// `escaped` line in the run's journal.
	escapes, err := r.escapeProbes(root, as, uid, gid)
	if err != nil {
		return m, err
	}

	// Cancel every run, 20 at once, each confirmed.
	t0 = time.Now()
	for i := 0; i < n; i += 20 {
		var cs []*exec.Cmd
		for j := i; j < min(i+20, n); j++ {
			c := as("cancel", "--wait", "30s", ids[j])
			if err := c.Start(); err != nil {
				return m, err
			}
			cs = append(cs, c)
		}
		for k, c := range cs {
			if err := c.Wait(); err != nil {
				return m, fmt.Errorf("cancel %s: %v", ids[i+k], err)
			}
		}
	}
	m.stopAll = time.Since(t0)
	m.escapes = escapes
	// A confirmed cancel is the final record; the wrapper exits right
	// after writing it.
	for i, pid := range pids {
		rec, err := readRecord(root, ids[i])
		if err != nil {
			return m, err
		}
		if err := bench.WaitUntil(30*time.Second, 10*time.Millisecond, func() (bool, error) {
			return !proc.Alive(pid, rec.WrapperStart), fmt.Errorf("run %s: its wrapper %d outlived its confirmed cancel by 30 s", ids[i], pid)
		}); err != nil {
			return m, err
		}
	}
	return m, nil
}

// idleFloor starts n copies of bin/idlefloor as the bench user, lets them
// settle and returns their mean RssAnon and Pss; they are stopped (TERM,
// by PID) before it returns.
func (r *runner) idleFloor(n int, uid, gid uint32) (anon, pss float64, err error) {
	bin := filepath.Join(filepath.Dir(r.self), "idlefloor")
	if _, err := os.Stat(bin); err != nil {
		return 0, 0, fmt.Errorf("the idle floor program: %w (make bench builds it: go build -trimpath -ldflags '-s -w' -o bin/idlefloor ./bench/cmd/idlefloor)", err)
	}
	var cs []*exec.Cmd
	defer func() {
		for _, c := range cs {
			_ = c.Process.Signal(syscall.SIGTERM)
			_ = c.Wait()
		}
	}()
	for range n {
		c := exec.Command(bin)
		c.Env = append(os.Environ(), "GOMAXPROCS=1") // as run --detach starts its supervisor
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}, Setpgid: true}
		c.Dir = "/"
		if err := c.Start(); err != nil {
			return 0, 0, err
		}
		cs = append(cs, c)
	}
	time.Sleep(2 * time.Second) // started, initialised and subscribed, as the wrappers after their settling second
	for _, c := range cs {
		a, err := bench.StatusBytes(c.Process.Pid, "RssAnon")
		if err != nil {
			return 0, 0, err
		}
		p, err := bench.RollupBytes(c.Process.Pid, "Pss")
		if err != nil {
			return 0, 0, err
		}
		anon += float64(a) / float64(n)
		pss += float64(p) / float64(n)
	}
	return anon, pss, nil
}

// ensureBenchUser returns the bench user's uid and gid, adding the user
// (a system account without a home or a shell) when missing.
func ensureBenchUser() (uid, gid uint32, err error) {
	u, err := user.Lookup(benchUser)
	if err != nil {
		if out, aerr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", benchUser).CombinedOutput(); aerr != nil {
			if u, err = user.Lookup(benchUser); err != nil {
				return 0, 0, fmt.Errorf("useradd %s: %v: %s", benchUser, aerr, out)
			}
		} else if u, err = user.Lookup(benchUser); err != nil {
			return 0, 0, err
		}
	}
	a, err1 := strconv.ParseUint(u.Uid, 10, 32)
	b, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("user %s: uid %q gid %q", benchUser, u.Uid, u.Gid)
	}
	return uint32(a), uint32(b), nil
}

// escapeProbes starts 5 probe runs beside the quiet ones, lets them sit a
// few seconds (their wrappers back off), then releases their jobs one after
// another, each into an escape, and times each until its journal says
// `escaped`. The probes are cancelled before it returns.
func (r *runner) escapeProbes(root string, as func(...string) *exec.Cmd, uid, gid uint32) ([]float64, error) {
	const probes = 5
	var ids, fifos []string
	for i := range probes {
		id := fmt.Sprintf("probe-%d", i)
		fifo := filepath.Join(root, "fifo-"+id)
		if err := unix.Mkfifo(fifo, 0o600); err != nil {
			return nil, err
		}
		if err := os.Chown(fifo, int(uid), int(gid)); err != nil {
			return nil, err
		}
		c := as("run", "--detach", "--cgroup", "off", "--lease", "10m", "--no-stream", id, "--", "sh", "-c", `read x < "$1"; setsid sleep 600 & wait`, "sh", fifo)
		if out, err := c.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("run --detach %s: %v: %s", id, err, out)
		}
		ids, fifos = append(ids, id), append(fifos, fifo)
	}
	defer func() {
		for _, id := range ids {
			_ = as("cancel", "--wait", "30s", id).Run()
		}
	}()
	time.Sleep(4 * time.Second) // quiet long enough for the looks to back off
	var got []float64
	for i, id := range ids {
		f, err := os.OpenFile(fifos[i], os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		_, werr := f.WriteString("go\n")
		f.Close()
		if werr != nil {
			return nil, werr
		}
		journal := filepath.Join(root, id, "events.jsonl")
		err = bench.WaitUntil(30*time.Second, 5*time.Millisecond, func() (bool, error) {
			b, err := os.ReadFile(journal)
			return err == nil && strings.Contains(string(b), `"escaped"`), fmt.Errorf("run %s: no escaped line", id)
		})
		if err != nil {
			return nil, err
		}
		got = append(got, time.Since(t0).Seconds())
		time.Sleep(700 * time.Millisecond) // the next release lands elsewhere in the look's period
	}
	return got, nil
}
