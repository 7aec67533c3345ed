//go:build linux

package cli

import (
	"encoding/json"
	"errors"

	"github.com/agent-wrap/agent-wrap/answer"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// failedCancelAnswer is the answer of a cancel that returned err.
func failedCancelAnswer(id string, rep *stop.Report, err error) answer.Cancel {
	outcome := answer.NotConfirmed
	switch {
	case errors.Is(err, stop.ErrNoRecord):
		outcome = answer.NoRecord
	case errors.Is(err, stop.ErrRefused):
		outcome = answer.Refused
	}
	var rec *statusfile.Record
	if rep != nil {
		rec = rep.Record
	}
	a := answer.NewCancel(id, outcome, rec)
	a.Reason = err.Error()
	return a
}

// printCancelAnswer writes a, the object of `cancel --json` (a controller
// reads it, never the line), as one line of JSON on stdout.
func (e *Env) printCancelAnswer(a answer.Cancel) {
	b, err := json.Marshal(a)
	if err != nil { // a holds strings and ints only
		panic(err)
	}
	e.Stdout.Write(append(b, '\n'))
}
