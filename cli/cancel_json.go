//go:build linux

package cli

import (
	"encoding/json"
	"errors"

	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// cancelAnswer is what `cancel --json RUN_ID` prints: one JSON object, the
// same facts as the plain line ("ID: [already ]STATE[ (cause C)], exit
// code N, survivors [...]") and, when cancel failed, why. A controller
// reads this, never the line.
type cancelAnswer struct {
	RunID string `json:"run_id"`
	// Outcome is what this cancel came to: "confirmed" (the run is
	// terminal and nothing of it survived), "already" (it was terminal
	// before this cancel), "not_confirmed" (no terminal record within
	// --wait, or processes outlived KILL), "refused" (nothing was
	// signalled: the run's processes could not be validated), or
	// "no_record" (the run's record cannot be read).
	Outcome   string `json:"outcome"`
	State     string `json:"state,omitempty"`     // the record's state, when there is one
	Cause     string `json:"cause,omitempty"`     // the record's cause
	ExitCode  *int   `json:"exit_code,omitempty"` // the run's exit code, when the record has one
	Survivors []int  `json:"survivors"`           // processes that outlived KILL; null: unknown (containment session)
	Reason    string `json:"reason,omitempty"`    // why the outcome is not confirmed or already
}

// Outcomes of cancelAnswer.
const (
	cancelConfirmed    = "confirmed"
	cancelAlready      = "already"
	cancelNotConfirmed = "not_confirmed"
	cancelRefused      = "refused"
	cancelNoRecord     = "no_record"
)

// newCancelAnswer fills an answer from the record rec (nil: none) with
// the outcome given.
func newCancelAnswer(id, outcome string, rec *statusfile.Record) cancelAnswer {
	a := cancelAnswer{RunID: id, Outcome: outcome, Survivors: []int{}}
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

// failedCancelAnswer is the answer of a cancel that returned err.
func failedCancelAnswer(id string, rep *stop.Report, err error) cancelAnswer {
	outcome := cancelNotConfirmed
	switch {
	case errors.Is(err, stop.ErrNoRecord):
		outcome = cancelNoRecord
	case errors.Is(err, stop.ErrRefused):
		outcome = cancelRefused
	}
	var rec *statusfile.Record
	if rep != nil {
		rec = rep.Record
	}
	a := newCancelAnswer(id, outcome, rec)
	a.Reason = err.Error()
	return a
}

// printCancelAnswer writes a as one line of JSON on stdout.
func (e *Env) printCancelAnswer(a cancelAnswer) {
	b, err := json.Marshal(a)
	if err != nil { // a holds strings and ints only
		panic(err)
	}
	e.Stdout.Write(append(b, '\n'))
}
