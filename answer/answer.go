// Package answer holds the JSON answers agent-wrap prints on a host for a
// controller to read: `cancel --json RUN_ID` (Cancel, one object) and
// `renew --json RUN_ID...` (Renew, one object per line, a line per run in
// the order given). The host's CLI writes them and the controller reads
// them with these types, so the bytes on the wire are declared once.
//
// Guarantees of the wire format (docs/reference.md states them for users):
//   - The field names and values are fixed: a field is added, never
//     renamed, and a value (an Outcome, a state) never changes meaning.
//     A reader ignores fields it does not know, so an older controller
//     reads a newer host and the other way round.
//   - State is the run record's state (statusfile's constants), read from
//     status.json by the command that answers; Cause is the record's.
//   - Cancel.Survivors is [] only as the promise that nothing of the run
//     outlived its stop, and null when that cannot be known; a reader takes
//     a run as ended only with Survivors == [] (Cancel.Final).
//   - Reason is for people: free text saying why, never parsed.
//
// Not guaranteed: that the run is still as answered when the answer is
// read; a later command's answer is the newer fact.
package answer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Outcome is what a cancel came to.
type Outcome string

// Outcomes of Cancel.
const (
	// Confirmed: the run is terminal and nothing of it survived.
	Confirmed Outcome = "confirmed"
	// Already: the run was terminal before this cancel.
	Already Outcome = "already"
	// NotConfirmed: no terminal record within --wait, processes outlived
	// KILL, or cleanup cannot be confirmed (survivors unknown).
	NotConfirmed Outcome = "not_confirmed"
	// Refused: nothing was signalled, the run's processes could not be
	// validated.
	Refused Outcome = "refused"
	// NoRecord: the run's record cannot be read; nothing was signalled.
	NoRecord Outcome = "no_record"
)

// Cancel is what `cancel --json RUN_ID` prints: one JSON object, the same
// facts as the plain line ("ID: [already ]STATE[ (cause C)], exit code N,
// survivors [...]") and, when cancel failed, why.
type Cancel struct {
	RunID     string  `json:"run_id"`
	Outcome   Outcome `json:"outcome"`
	State     string  `json:"state,omitempty"`     // the record's state (statusfile), when there is a record
	Cause     string  `json:"cause,omitempty"`     // the record's cause
	ExitCode  *int    `json:"exit_code,omitempty"` // the run's exit code, when the record has one
	Survivors []int   `json:"survivors"`           // processes that outlived KILL; null: unknown (containment session)
	Reason    string  `json:"reason,omitempty"`    // why the outcome is not Confirmed or Already
}

// NewCancel is the answer for run id with the outcome given, holding the
// facts of the record rec (nil: none): Survivors is [] when the record
// lists none, null when it cannot vouch for them.
func NewCancel(id string, outcome Outcome, rec *statusfile.Record) Cancel {
	a := Cancel{RunID: id, Outcome: outcome, Survivors: []int{}}
	if rec != nil {
		a.State, a.Cause, a.ExitCode = rec.State, rec.Cause, rec.ExitCode
		if rec.Survivors != nil {
			a.Survivors = rec.Survivors
		}
		if rec.SurvivorsUnknown() {
			a.Survivors = nil // null: unknown, not the promise []
		}
	}
	return a
}

// ParseCancel reads cancel --json's output, one JSON object (surrounding
// space allowed). Anything else, the plain line included, is an error.
func ParseCancel(out string) (Cancel, error) {
	var a Cancel
	err := json.Unmarshal([]byte(strings.TrimSpace(out)), &a)
	return a, err
}

// Final reports whether a says that run id has ended for good: a Confirmed
// (or Already) terminal record of that run, with an exit code and the
// promise that nothing survived. Any other answer leaves the run to
// reconcile.
func (a Cancel) Final(id string) bool {
	if a.RunID != id || a.ExitCode == nil || a.Survivors == nil || len(a.Survivors) > 0 {
		return false
	}
	if a.Outcome != Confirmed && a.Outcome != Already {
		return false
	}
	return statusfile.Terminal(a.State)
}

// Renew is one line of `renew --json RUN_ID...`: what became of one run's
// renewal. Exactly one of Renewed, Refused and NoRun is true, or none when
// the renewal failed otherwise (Reason says how).
type Renew struct {
	RunID    string `json:"run_id"`
	Renewed  bool   `json:"renewed"`
	State    string `json:"state,omitempty"`          // the run's state (statusfile) as read under its lock; "" when there is no such run
	Deadline int64  `json:"deadline_epoch,omitempty"` // the new deadline, Unix seconds, when renewed
	Refused  bool   `json:"refused,omitempty"`        // the run is over, cancelling or expired (lease.ErrRefused): renewing it again is pointless
	NoRun    bool   `json:"no_run,omitempty"`         // no run of this ID under the root
	Reason   string `json:"reason,omitempty"`         // why it was not renewed (or, renewed, why the journal line is missing)
}

// ParseRenew reads renew --json's output: the answer of each line that is
// a JSON object naming a run, by run ID. Other lines are skipped: a host
// whose agent-wrap has no renew --json gives none.
func ParseRenew(out []byte) map[string]Renew {
	got := map[string]Renew{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var a Renew
		if json.Unmarshal(sc.Bytes(), &a) == nil && a.RunID != "" {
			got[a.RunID] = a
		}
	}
	return got
}
