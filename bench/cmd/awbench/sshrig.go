package main

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// sshRig is what a controller figure measures through: a throwaway sshd
// on 127.0.0.1 (internal/sshtest), a run root on that "host", and one
// shared ControlMaster to it.
type sshRig struct {
	r       *runner
	srv     *sshtest.Server
	root    string   // the host's --root
	sshArgs []string // ssh's words for the shared ControlMaster
	rsh     string   // the same as one --rsh line
}

// sshRig starts the sshd, makes the root scratch/rootName and starts the
// ControlMaster on the socket scratch/master. sshd's failures end the
// figure through benchTB: the caller defers catchFatal.
func (r *runner) sshRig(rootName, master string) (*sshRig, error) {
	g := &sshRig{r: r, srv: sshtest.Start(&benchTB{r: r})}
	var err error
	if g.root, err = r.newRoot(rootName); err != nil {
		return nil, err
	}
	if g.sshArgs, g.rsh, err = r.sshMaster(g.srv, master); err != nil {
		return nil, err
	}
	return g, nil
}

// ctlArgv is the command line of `agent-wrap ssh` for run id through the
// rig, with --lease 60s --grace 2s and the ledger led, running argv.
func (g *sshRig) ctlArgv(led, id string, argv ...string) []string {
	args := []string{g.r.bin, "ssh", "--rsh", g.rsh, "--remote-bin", g.r.bin, "--remote-root", g.root, "--ledger", led,
		"--id", id, "--lease", "60s", "--grace", "2s", g.srv.Destination(), "--"}
	return append(args, argv...)
}

// ctl is ctlArgv's command, in a process group of its own.
func (g *sshRig) ctl(led, id string, argv ...string) *exec.Cmd {
	return groupCommand(g.ctlArgv(led, id, argv...))
}

// groupCommand is the command argv, to start in a process group of its own.
func groupCommand(argv []string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// timeCmd runs cmd to its end and returns its wall time in seconds; a
// failure names its arguments and carries its output.
func timeCmd(cmd *exec.Cmd) (float64, error) {
	t0 := bench.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%v: %v: %s", cmd.Args, err, out)
	}
	return bench.Since(t0), nil
}

// reattachDelay starts cmd, a controller whose job writes to stdout
// without end, waits for its first output and for victim (what to kill:
// its attach session's client, or that session's ControlMaster; 0 while
// there is none, which an error calls "no NOUN of PID"), SIGKILLs the
// victim, and returns the seconds from the kill to the first byte written
// after the victim is gone: what was in flight when it died arrives
// first, so the next write is the reattach's. cmd is SIGINTed and waited
// for on return, and its group KILLed at cleanup.
func (r *runner) reattachDelay(cmd *exec.Cmd, noun string, victim func() int) (float64, error) {
	cw := &chunkClock{}
	cmd.Stdout = cw
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	r.killGroupAtCleanup(cmd)
	defer func() {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}()
	var pid int
	if err := bench.WaitUntil(30*time.Second, time.Millisecond, func() (bool, error) {
		pid = victim()
		return pid > 0 && cw.count() > 0, fmt.Errorf("no %s of %d", noun, cmd.Process.Pid)
	}); err != nil {
		return 0, err
	}
	t0 := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	if err := bench.WaitUntil(10*time.Second, time.Millisecond, func() (bool, error) {
		st, err := proc.ReadStat(pid)
		return err != nil || st.Dead(), nil
	}); err != nil {
		return 0, err
	}
	mark := cw.count()
	var first time.Time
	if err := bench.WaitUntil(30*time.Second, time.Millisecond, func() (bool, error) {
		first = cw.firstAfter(mark)
		return !first.IsZero(), fmt.Errorf("no byte after the reattach")
	}); err != nil {
		return 0, err
	}
	return first.Sub(t0).Seconds(), nil
}

// msRow records a figure measured as a seconds against a baseline of b
// seconds (both shown in ms, what b is in parentheses), passed at a/b ≤
// most.
func (r *runner) msRow(figure string, a, b float64, baseline string, most float64) {
	r.rows = append(r.rows, row{
		figure:   figure,
		measured: bench.Ms(a), baseline: bench.Ms(b) + " (" + baseline + ")",
		ratio: fmt.Sprintf("%.2f×", a/b), target: fmt.Sprintf("≤ %g×", most), limit: fmt.Sprintf("%.2f", a/b/most),
		pass: passIf(a/b <= most),
	})
}

// msReport is msRow for a figure with no target: reported, never failed;
// digits is the ratio's precision.
func (r *runner) msReport(figure string, a, b float64, baseline string, digits int) {
	r.rows = append(r.rows, row{
		figure:   figure,
		measured: bench.Ms(a), baseline: bench.Ms(b) + " (" + baseline + ")",
		ratio: fmt.Sprintf("%.*f×", digits, a/b), target: "report", limit: "-", pass: "n/a",
	})
}
