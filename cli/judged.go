package cli

import "github.com/agent-wrap/agent-wrap/reconcile"

// stateUnreadable is the judged state of a run without a readable record.
const stateUnreadable = "unreadable"

// stateLost is the judged state of a run whose record is not terminal
// while its wrapper is gone (reconcile's supervisor "lost"): the record's
// state is then a claim nobody keeps, and is shown as record_state only.
const stateLost = "lost"

// judgedState is the state list, status and show give a run: the record's
// own, stateLost when nothing supervises a run whose record is not
// terminal (so it never reads running or cancelling), stateUnreadable
// without a record.
func judgedState(in reconcile.Input, v reconcile.Verdict) string {
	switch {
	case in.Record == nil:
		return stateUnreadable
	case v.Supervisor == reconcile.SupervisorLost:
		return stateLost
	}
	return in.Record.State
}
