//go:build linux

package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/answer"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// renewMany renews each run in ids in turn, each with lease.Renew (under
// that run's own lock), and prints one JSON line per run, in the order
// given. Every ID is checked before any run is touched. Exit 0 when every
// run was renewed, 1 otherwise.
func (e *Env) renewMany(ids []string, d time.Duration) int {
	for _, id := range ids {
		if err := rundir.ValidID(id); err != nil {
			e.errorf("%v", err)
			e.hint("run IDs match %s; nothing was renewed", rundir.IDPattern)
			return ExitUsage
		}
	}
	root, code := e.openRoot(false)
	if root == nil {
		return code
	}
	defer root.Close()
	enc := json.NewEncoder(e.Stdout)
	all := true
	for _, id := range ids {
		a := renewOne(root, id, d)
		all = all && a.Renewed
		if err := enc.Encode(a); err != nil {
			e.errorf("renew: %v", err)
			return ExitFailure
		}
	}
	if !all {
		return ExitFailure
	}
	return ExitOK
}

// renewOne renews run id under root by d and says what became of it, as
// one line of renew --json.
func renewOne(root *rundir.Root, id string, d time.Duration) answer.Renew {
	a := answer.Renew{RunID: id}
	dir, err := root.Open(id)
	if err != nil {
		a.NoRun = errors.Is(err, rundir.ErrNoRun)
		a.Reason = err.Error()
		return a
	}
	defer dir.Close()
	next, err := lease.Renew(dir, d)
	_ = completeJournal(dir) // the answer is the renewal's; the watchdog's next pass retries a failure
	if rec, rerr := statusfile.Read(dir); rerr == nil {
		a.State = rec.State
	}
	switch {
	case err == nil:
		a.Renewed, a.Deadline = true, next
	case errors.Is(err, lease.ErrRefused):
		a.Refused, a.Reason = true, err.Error()
	case next != 0:
		// Renewed, but the journal line could not be written: the
		// deadline moved, which is what the caller asked for.
		a.Renewed, a.Deadline, a.Reason = true, next, err.Error()
	default:
		a.Reason = fmt.Sprintf("cannot renew: %v", err)
	}
	return a
}
