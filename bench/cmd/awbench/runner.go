package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

type runner struct {
	bin     string // agent-wrap, absolute
	alt     string // -compare: a proposed build, sampled alongside; "" for none
	self    string // this program, for `awbench readall`
	scratch string // private temp dir; run roots below it
	quick   bool
	log     io.Writer
	has     func(command string) bool

	seq     int
	rows    []row
	details []string

	costRows    []string // the building blocks, in the report's second table
	leaseLatest float64  // the latest lease sample and where its time went
	leaseWorst  string

	machine               []string
	loadBefore, loadAfter string
	elapsed               time.Duration

	mu       sync.Mutex
	lastCPU  float64 // user+sys seconds of the last span's process and the children it reaped
	cleanups []func()
}

// row is one line of the table. pass is "pass", "FAIL", "n/a" or "error".
type row struct {
	figure, measured, baseline, ratio, target, limit, pass string
}

func (r *runner) logf(format string, a ...any) {
	fmt.Fprintf(r.log, "awbench: "+format+"\n", a...)
}

func (r *runner) detail(format string, a ...any) {
	r.details = append(r.details, fmt.Sprintf(format, a...))
}

// n picks the sample count for the mode.
func (r *runner) n(full, quick int) int {
	if r.quick {
		return quick
	}
	return full
}

func (r *runner) id(prefix string) string {
	r.seq++
	return prefix + "-" + strconv.Itoa(r.seq)
}

// newRoot makes a fresh run root (mode 0700) below the scratch directory.
func (r *runner) newRoot(name string) (string, error) {
	p := filepath.Join(r.scratch, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		return "", err
	}
	return p, nil
}

// onCleanup registers f to run at the end of the figure (last first).
func (r *runner) onCleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// killGroupAtCleanup KILLs the process group of cmd (started with Setpgid,
// so PGID == its PID) at cleanup, unless cmd was waited for by then. While
// its leader is unreaped the number cannot be handed out again; once it is
// reaped, a bare kill(-pid) could reach a group of another program that got
// the number since, on a machine that others share.
func (r *runner) killGroupAtCleanup(cmd *exec.Cmd) {
	r.onCleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
}

func (r *runner) cleanupAll() {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// started is a process started by awbench, in a process group of its own
// (PGID == PID), pinned by a pidfd.
type started struct {
	cmd  *exec.Cmd
	pfd  *bench.Pidfd
	pid  int
	done bool
}

// start starts argv in its own process group with stdin /dev/null and the
// given stdout (nil: /dev/null) and stderr (nil: /dev/null). Its group is
// KILLed at cleanup if it is still there.
func (r *runner) start(stdout, stderr *os.File, setsid bool, argv ...string) (*started, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if stderr != nil {
		cmd.Stderr = stderr
	}
	if setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &started{cmd: cmd, pid: cmd.Process.Pid}
	pfd, err := bench.OpenPidfd(p.pid, 0)
	if err != nil {
		_ = unix.Kill(-p.pid, unix.SIGKILL)
		_ = cmd.Wait()
		return nil, err
	}
	p.pfd = pfd
	r.onCleanup(func() {
		if !p.done {
			// Its group, by the PGID we gave it; then reap it.
			_ = unix.Kill(-p.pid, unix.SIGKILL)
			_ = p.wait()
		}
		p.pfd.Close()
	})
	return p, nil
}

// exited waits for the process to exit (seen through the pidfd, not yet
// reaped) and returns when.
func (p *started) exited(timeout time.Duration) (time.Time, error) {
	return p.pfd.Wait(timeout)
}

// wait reaps the process and returns its exit code (128+N for signal N).
func (p *started) wait() error {
	err := p.cmd.Wait()
	p.done = true
	if _, ok := err.(*exec.ExitError); ok {
		return nil
	}
	return err
}

func (p *started) code() int {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return p.cmd.ProcessState.ExitCode()
}

// timed runs argv to its end and returns the wall time from just before the
// fork to the exit, checking the exit code.
func (r *runner) timed(want int, stdout *os.File, argv ...string) (float64, error) {
	t0, end, err := r.span(want, stdout, argv...)
	return end.Sub(t0).Seconds(), err
}

// cpu returns the CPU time of the last process span waited for.
func (r *runner) cpu() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastCPU
}

// span is timed, returning the start and the end of the clock.
func (r *runner) span(want int, stdout *os.File, argv ...string) (t0, end time.Time, err error) {
	t0 = time.Now()
	p, err := r.start(stdout, nil, false, argv...)
	if err != nil {
		return t0, t0, err
	}
	defer p.pfd.Close()
	end, err = p.exited(5 * time.Minute)
	if err != nil {
		return t0, t0, err
	}
	if err := p.wait(); err != nil {
		return t0, t0, err
	}
	if c := p.code(); c != want {
		return t0, t0, fmt.Errorf("%v exited %d, want %d", argv, c, want)
	}
	if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		r.mu.Lock()
		r.lastCPU = cpu.Seconds()
		r.mu.Unlock()
	}
	return t0, end, nil
}

// readRecord reads a run's status.json directly (no lock: the file is
// replaced atomically, so a read sees one whole record).
func readRecord(root, id string) (*statusfile.Record, error) {
	b, err := os.ReadFile(filepath.Join(root, id, "status.json"))
	if err != nil {
		return nil, err
	}
	return statusfile.Parse(b)
}

// waitRunning waits until the run is `running` and, when want is not nil,
// until want holds for the live processes below the wrapper.
func waitRunning(root, id string, wrapper int, want func([]proc.Stat) bool) (*statusfile.Record, error) {
	var rec *statusfile.Record
	err := bench.WaitUntil(time.Minute, time.Millisecond, func() (bool, error) {
		var err error
		rec, err = readRecord(root, id)
		if err != nil {
			return false, err
		}
		if rec.State != statusfile.Running {
			return false, fmt.Errorf("state %s", rec.State)
		}
		if want == nil {
			return true, nil
		}
		ds, err := bench.Descendants(wrapper)
		if err != nil {
			return false, err
		}
		return want(ds), fmt.Errorf("processes below the wrapper: %v", ds)
	})
	return rec, err
}

// twoSleeps is the tree of the cancel figure once it exists: the shell and
// its two sleeps, all alive, the sleeps past their exec.
func twoSleeps(ds []proc.Stat) bool {
	return len(ds) == 3 && bench.CountComm(ds, "sleep") == 2 && bench.CountComm(ds, "sh") == 1
}

// killGroupMembers KILLs what is left of process group pgid, whose leader
// started at leaderStart, judged by /proc: a member must be in that group
// and started no earlier than minStart, and the group number must not have
// been recycled (a live process at PID pgid with another start time is a
// new group's leader: then nothing in the group is ours). It reports how
// many it found.
func killGroupMembers(pgid int, leaderStart, minStart uint64) int {
	all, err := proc.Scan()
	if err != nil {
		return 0
	}
	if groupRecycled(all, pgid, leaderStart) {
		return 0
	}
	n := 0
	for _, p := range all {
		if p.PGID == pgid && !p.Dead() && p.Start >= minStart {
			n++
			_ = stop.Signal(proc.Identity{PID: p.PID, Start: p.Start, PGID: pgid}, unix.SIGKILL)
		}
	}
	return n
}

// groupRecycled reports whether the process now at PID pgid in the scan
// all is not the group's leader that started at leaderStart.
func groupRecycled(all []proc.Stat, pgid int, leaderStart uint64) bool {
	for _, p := range all {
		if p.PID == pgid {
			return p.Start != leaderStart
		}
	}
	return false
}
