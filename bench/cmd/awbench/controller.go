package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// controllerFigure: `agent-wrap ssh` against plain ssh, through a
// throwaway sshd on 127.0.0.1 (internal/sshtest) and one shared
// ControlMaster, all in one run:
//   - a run of `true` through the controller against `ssh DEST agent-wrap
//     run ID -- true` (target ≤ 1.3×);
//   - SIGINT to the controller until it has exited with the run's final
//     record (the remote tree checked gone after), against one `ssh DEST
//     true` round trip;
//   - a reattach after the attach's ssh client is SIGKILLed: time until the
//     first new byte, against one round trip (the controller's first
//     retry is at once).
func (r *runner) controllerFigure() (err error) {
	defer catchFatal(&err)
	g, err := r.sshRig("controller", "cm")
	if err != nil {
		return err
	}
	srv, root := g.srv, g.root
	ledgerDir := filepath.Join(r.scratch, "controller-ledger")
	ssh := func(line string) *exec.Cmd {
		return exec.Command("ssh", append(append([]string{}, g.sshArgs...), "--", srv.Destination(), line)...)
	}
	ctl := func(id string, argv ...string) *exec.Cmd { return g.ctl(ledgerDir, id, argv...) }
	roundTrip := func() (float64, error) { return timeCmd(ssh("true")) }

	// 1. A run of `true`.
	viaCtl := func() (float64, error) { return timeCmd(ctl(r.id("ctl"), "true")) }
	viaSSH := func() (float64, error) {
		return timeCmd(ssh(sshtest.Quote(r.bin, "--root", root, "run", r.id("plain"), "--", "true")))
	}
	// The controller's remote line alone, by hand: what the host costs,
	// apart from the controller's own work.
	remoteLine := func() (float64, error) {
		id := r.id("line")
		q := func(w ...string) string { return sshtest.Quote(append([]string{r.bin, "--root", root}, w...)...) }
		return timeCmd(ssh(q("run", "--detach", "--lease", "1m0s", "--grace", "2s", id, "--", "true") + " 2>&1 && exec " + q("attach", "--from", "0,0", id)))
	}
	s, err := bench.Interleave(2, r.n(30, 10), viaCtl, viaSSH, roundTrip, remoteLine)
	if err != nil {
		return err
	}
	a, b := bench.Median(s[0]), bench.Median(s[1])
	r.msRow("controller run of `true`", a, b, "ssh DEST agent-wrap run ID -- true", 1.3)
	r.detail("controller `agent-wrap ssh DEST -- true`: %s; `ssh DEST agent-wrap run ID -- true`: %s; `ssh DEST true`: %s (one shared ControlMaster)",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms), spread(s[2], bench.Ms))
	r.detail("controller: its remote line by hand (`ssh DEST 'agent-wrap run --detach ... 2>&1 && exec agent-wrap attach ...'`): %s, so of the %s the controller adds to plain run, the host's detach and attach take %s and the controller's own work %s",
		spread(s[3], bench.Ms), bench.Ms(a-b), bench.Ms(bench.Median(s[3])-b), bench.Ms(a-bench.Median(s[3])))

	// 2. SIGINT until the controller exits with the tree gone.
	cancelOnce := func() (float64, error) {
		id := r.id("ctl-int")
		cmd := ctl(id, "sh", "-c", "sleep 300 & sleep 300 & echo started; wait")
		out, err := r.startUntilStarted(cmd, "controller")
		if err != nil {
			return 0, err
		}
		t0 := bench.Now()
		cmd.Process.Signal(syscall.SIGINT)
		io.Copy(io.Discard, out)
		err = cmd.Wait()
		d := bench.Since(t0)
		if code := cmd.ProcessState.ExitCode(); code != 143 {
			return 0, fmt.Errorf("controller after SIGINT: exit %d (%v), want 143", code, err)
		}
		rec, err := readRecord(root, id)
		if err != nil {
			return 0, err
		}
		if n := liveMembers(rec.PGID); n != 0 {
			return 0, fmt.Errorf("run %s: %d members of group %d alive after the controller exited", id, n, rec.PGID)
		}
		return d, nil
	}
	s, err = bench.Interleave(1, r.n(12, 5), cancelOnce, roundTrip)
	if err != nil {
		return err
	}
	a, b = bench.Median(s[0]), bench.Median(s[1])
	r.msReport("controller SIGINT to confirmed cancel", a, b, "ssh DEST true", 1)
	r.detail("controller SIGINT until exit 143 with the remote tree gone: %s; one round trip: %s", spread(s[0], bench.Ms), spread(s[1], bench.Ms))

	// 3. Reattach after the attach client is killed.
	reattachOnce := func() (float64, error) {
		id := r.id("ctl-re")
		cmd := ctl(id, "sh", "-c", "while :; do echo x; sleep 0.005; done")
		return r.reattachDelay(cmd, "attach client", func() int { return attachClient(cmd.Process.Pid) })
	}
	s, err = bench.Interleave(1, r.n(10, 4), reattachOnce, roundTrip)
	if err != nil {
		return err
	}
	a, b = bench.Median(s[0]), bench.Median(s[1])
	r.msReport("controller reattach to first new byte", a, b, "ssh DEST true", 1)
	r.detail("controller reattach, client SIGKILLed to the first new byte (the first retry is at once): %s; one round trip: %s",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms))

	return nil
}

// liveMembers counts the live processes of group pgid.
func liveMembers(pgid int) int {
	all, _ := proc.Scan()
	n := 0
	for _, p := range all {
		if p.PGID == pgid && !p.Dead() {
			n++
		}
	}
	return n
}

// attachClient is the controller's ssh child whose command line runs
// `attach` (among the controller's own children, by parent PID).
func attachClient(ctl int) int {
	all, _ := proc.Scan()
	for _, p := range all {
		if p.PPID != ctl || p.Dead() {
			continue
		}
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/cmdline"); err == nil && bytes.Contains(b, []byte(" attach ")) {
			return p.PID
		}
	}
	return 0
}

// chunkClock counts bytes written and when each write came.
type chunkClock struct {
	mu    sync.Mutex
	n     int
	marks []struct {
		n  int
		at time.Time
	}
}

func (c *chunkClock) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += len(p)
	c.marks = append(c.marks, struct {
		n  int
		at time.Time
	}{c.n, time.Now()})
	return len(p), nil
}

func (c *chunkClock) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// firstAfter returns when the count first passed mark, or zero.
func (c *chunkClock) firstAfter(mark int) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.marks {
		if m.n > mark {
			return m.at
		}
	}
	return time.Time{}
}

// benchTB is the sshtest.T that internal/sshtest needs, outside a test:
// its temp dirs live in the scratch directory, its cleanups run with the
// figure's, and a fatal error ends the figure with that error.
type benchTB struct {
	r *runner
}

var _ sshtest.T = (*benchTB)(nil)

type benchFatal struct{ error }

// catchFatal, deferred by a figure with a named error result, turns a
// benchTB failure (a benchFatal panic) into that error; any other panic
// goes on.
func catchFatal(err *error) {
	if p := recover(); p != nil {
		if f, ok := p.(benchFatal); ok {
			*err = f
			return
		}
		panic(p)
	}
}

func (b *benchTB) Helper()                        {}
func (b *benchTB) Cleanup(f func())               { b.r.onCleanup(f) }
func (b *benchTB) Logf(format string, a ...any)   { b.r.logf(format, a...) }
func (b *benchTB) Errorf(format string, a ...any) { b.r.logf(format, a...) }
func (b *benchTB) Fatalf(format string, a ...any) { panic(benchFatal{fmt.Errorf(format, a...)}) }
func (b *benchTB) Skipf(format string, a ...any)  { panic(benchFatal{fmt.Errorf(format, a...)}) }

// TempDir is a new directory under the scratch root, unique across every
// figure's benchTB (each figure makes its own).
func (b *benchTB) TempDir() string {
	d, err := os.MkdirTemp(b.r.scratch, "sshd-")
	if err != nil {
		panic(benchFatal{err})
	}
	return d
}

// sshMaster starts one ControlMaster to srv on the socket scratch/name:
// ssh -M -N -f forks it into the background, and it is stopped through its
// control socket (ssh -O exit), never by name. It returns the ssh words
// that use it and the same as one --rsh line.
func (r *runner) sshMaster(srv *sshtest.Server, name string) (sshArgs []string, rsh string, err error) {
	sshArgs = append(srv.SSHArgs(), "-o", "ControlPath="+filepath.Join(r.scratch, name))
	master := exec.Command("ssh", append(append([]string{}, sshArgs...), "-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-N", "-f", "--", srv.Destination())...)
	if out, err := master.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("ControlMaster: %v: %s", err, out)
	}
	r.onCleanup(func() {
		exec.Command("ssh", append(append([]string{}, sshArgs...), "-O", "exit", "--", srv.Destination())...).Run()
	})
	return sshArgs, sshtest.Quote(append([]string{"ssh"}, sshArgs...)...), nil
}
