//go:build linux

// Runs by ID, shared by the commands: opening one to read it, and the
// answer to a second `run` of an ID already claimed.

package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// openRun validates id, opens the root (never creating it) and the run
// directory. On failure it prints the error and returns the exit code.
func (e *Env) openRun(id string) (*rundir.Root, *rundir.Dir, int) {
	if code := e.checkIDs(id); code != 0 {
		return nil, nil, code
	}
	root, code := e.openRoot(false)
	if root == nil {
		return nil, nil, code
	}
	d, err := root.Open(id)
	if err != nil {
		root.Close()
		e.errorf("%v", err)
		switch {
		case errors.Is(err, rundir.ErrNoRun):
			e.hint("list the runs with 'agent-wrap list'")
			return nil, nil, ExitNoRun
		case errors.Is(err, rundir.ErrUnsafe):
			e.hint("a run directory must be a real directory owned by you, mode 0700; nothing was read through it")
			return nil, nil, ExitUnsafeRoot
		}
		return nil, nil, ExitFailure
	}
	return root, d, 0
}

// existingRun answers a second `run` with an ID already claimed: the command
// never runs twice. A terminal run returns its recorded code; a live or
// unknown one exits 75 with what to do instead.
func (e *Env) existingRun(root *rundir.Root, id string) int {
	d, err := root.Open(id)
	if err != nil {
		e.errorf("run %s exists but cannot be opened: %v", id, err)
		if errors.Is(err, rundir.ErrUnsafe) {
			return ExitUnsafeRoot
		}
		return ExitTempFail
	}
	defer d.Close()
	rec, err := statusfile.Read(d)
	if err != nil {
		e.errorf("run %s already exists and its outcome is unknown: %v", id, err)
		e.hint("the command was not run again; see what happened with 'agent-wrap reconcile %s'", id)
		return ExitTempFail
	}
	if statusfile.Terminal(rec.State) {
		fmt.Fprintf(e.Stderr, "agent-wrap: run %s already %s with exit code %d (ended %s); not running it again\n",
			id, strings.ReplaceAll(rec.State, "_", " "), rec.Code(), rec.EndedAt)
		return rec.Code()
	}
	if membership.WrapperAlive(rec) {
		e.errorf("run %s is already %s (job PID %d, wrapper PID %d); not running it again", id, rec.State, rec.PID, rec.WrapperPID)
		e.hint("follow it with 'agent-wrap logs -f %s' or 'agent-wrap wait %s'", id, id)
		return ExitTempFail
	}
	e.errorf("run %s exists (state %s) but its wrapper is gone; its outcome is unknown; not running it again", id, rec.State)
	e.hint("see what happened with 'agent-wrap reconcile %s'", id)
	return ExitTempFail
}
