package main

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/agent-wrap/agent-wrap/bench"
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
	defer catchFatal(&err)
	outerRoot, err := r.newRoot("nested-outer")
	if err != nil {
		return err
	}
	g, err := r.sshRig("nested-inner", "cm-nested")
	if err != nil {
		return err
	}
	innerRoot := g.root
	ledgerDir := filepath.Join(r.scratch, "nested-ledger")
	ctlArgv := func(id string, argv ...string) []string { return g.ctlArgv(ledgerDir, id, argv...) }
	outer := func(id string, job ...string) *exec.Cmd {
		args := []string{r.bin, "--root", outerRoot, "run", "--lease", "60s", "--grace", "2s", "--handoff-grace", "20s", id, "--"}
		return groupCommand(append(args, job...))
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
	r.msReport("nested `agent-wrap ssh DEST -- true` in a run", a, b, "the same, AGENT_WRAP_CONTROL unset", 2)
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
		cmd := groupCommand(ctlArgv(id, job...))
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
	r.msReport("outer cancel, inner confirmed first", a, b, "SIGINT to a controller outside a run", 2)
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
