package main

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// nestedFigure: nested runs, an `agent-wrap ssh` inside a local
// run, through a throwaway sshd and one shared ControlMaster:
//   - an outer run whose job is `agent-wrap ssh DEST -- true` (a handoff:
//     registration, lease report, outcome report, three synced journal
//     lines) against the same outer run with AGENT_WRAP_CONTROL removed
//     from the controller's environment (no handoff);
//   - `cancel` of the outer run until it returns with the inner run
//     confirmed cancelled before the outer group was signalled, against
//     SIGINT to a controller outside any run until it exits (the same
//     confirmed remote cancel, without the outer run around it).
func (r *runner) nestedFigure() (err error) {
	tb := &benchTB{r: r}
	defer catchFatal(&err)
	srv := sshtest.Start(tb)
	outerRoot, err := r.newRoot("nested-outer")
	if err != nil {
		return err
	}
	innerRoot, err := r.newRoot("nested-inner")
	if err != nil {
		return err
	}
	ledgerDir := filepath.Join(r.scratch, "nested-ledger")
	_, rsh, err := r.sshMaster(srv, "cm-nested")
	if err != nil {
		return err
	}
	ctlArgv := func(id string, argv ...string) []string {
		args := []string{r.bin, "ssh", "--rsh", rsh, "--remote-bin", r.bin, "--remote-root", innerRoot, "--ledger", ledgerDir,
			"--id", id, "--lease", "60s", "--grace", "2s", srv.Destination(), "--"}
		return append(args, argv...)
	}
	outer := func(id string, job ...string) *exec.Cmd {
		args := []string{"--root", outerRoot, "run", "--lease", "60s", "--grace", "2s", "--handoff-grace", "20s", id, "--"}
		cmd := exec.Command(r.bin, append(args, job...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}
	timeCmd := func(cmd *exec.Cmd) (float64, error) {
		t0 := bench.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("%v: %v: %s", cmd.Args, err, out)
		}
		return bench.Since(t0), nil
	}

	// 1. A nested run of `true`, with and without the handoff.
	nested := func() (float64, error) {
		id := r.id("nest")
		d, err := timeCmd(outer(r.id("outer"), ctlArgv(id, "true")...))
		return d, err
	}
	plain := func() (float64, error) {
		job := append([]string{"env", "-u", "AGENT_WRAP_CONTROL"}, ctlArgv(r.id("plain"), "true")...)
		return timeCmd(outer(r.id("outer"), job...))
	}
	s, err := bench.Interleave(2, r.n(20, 6), nested, plain)
	if err != nil {
		return err
	}
	a, b := bench.Median(s[0]), bench.Median(s[1])
	r.rows = append(r.rows, row{
		figure:   "nested `agent-wrap ssh DEST -- true` in a run",
		measured: bench.Ms(a), baseline: bench.Ms(b) + " (the same, AGENT_WRAP_CONTROL unset)",
		ratio: fmt.Sprintf("%.2f×", a/b), target: "report", limit: "-", pass: "n/a",
	})
	r.detail("nested: outer run of `agent-wrap ssh DEST -- true` with the handoff: %s; without (env -u AGENT_WRAP_CONTROL): %s",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms))

	// 2. Cancel of the outer run, the inner one confirmed first.
	job := []string{"sh", "-c", "sleep 300 & sleep 300 & echo started; wait"}
	outerCancel := func() (float64, error) {
		oid, iid := r.id("outer-c"), r.id("nest-c")
		cmd := outer(oid, ctlArgv(iid, job...)...)
		out, err := r.startUntilStarted(cmd, "nested")
		if err != nil {
			return 0, err
		}
		d, err := timeCmd(exec.Command(r.bin, "--root", outerRoot, "cancel", "--wait", "60s", oid))
		io.Copy(io.Discard, out)
		cmd.Wait()
		if err != nil {
			return 0, err
		}
		rec, err := readRecord(outerRoot, oid)
		if err != nil {
			return 0, err
		}
		if len(rec.Handoffs) != 1 || rec.Handoffs[0].Outcome != "cancelled" {
			return 0, fmt.Errorf("outer run %s: handoffs %+v, want one, cancelled", oid, rec.Handoffs)
		}
		inner, err := readRecord(innerRoot, iid)
		if err != nil {
			return 0, err
		}
		if inner.State != statusfile.Cancelled || liveMembers(inner.PGID) != 0 {
			return 0, fmt.Errorf("inner run %s: %s with %d members alive", iid, inner.State, liveMembers(inner.PGID))
		}
		return d, nil
	}
	plainCancel := func() (float64, error) {
		id := r.id("plain-c")
		argv := ctlArgv(id, job...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := r.startUntilStarted(cmd, "controller")
		if err != nil {
			return 0, err
		}
		t0 := bench.Now()
		cmd.Process.Signal(syscall.SIGINT)
		io.Copy(io.Discard, out)
		cmd.Wait()
		d := bench.Since(t0)
		if code := cmd.ProcessState.ExitCode(); code != 143 {
			return 0, fmt.Errorf("controller after SIGINT: exit %d, want 143", code)
		}
		return d, nil
	}
	s, err = bench.Interleave(1, r.n(10, 4), outerCancel, plainCancel)
	if err != nil {
		return err
	}
	a, b = bench.Median(s[0]), bench.Median(s[1])
	r.rows = append(r.rows, row{
		figure:   "outer cancel, inner confirmed first",
		measured: bench.Ms(a), baseline: bench.Ms(b) + " (SIGINT to a controller outside a run)",
		ratio: fmt.Sprintf("%.2f×", a/b), target: "report", limit: "-", pass: "n/a",
	})
	r.detail("nested: `cancel` of the outer run until its final record, the inner run cancelled and confirmed before the outer group's first signal: %s; SIGINT to a controller outside any run until exit 143: %s",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms))
	return nil
}

// startUntilStarted starts cmd (in a process group of its own, killed at
// cleanup) and reads its stdout until the job's "started" line; what
// names it in an error. The rest of stdout is the caller's to drain.
func (r *runner) startUntilStarted(cmd *exec.Cmd, what string) (io.ReadCloser, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r.killGroupAtCleanup(cmd)
	line := make([]byte, 8)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "started\n" {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("%s: no 'started' line (%q, %v)", what, line, err)
	}
	return out, nil
}
