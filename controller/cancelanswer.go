package controller

import (
	"encoding/json"
	"strings"
)

// finalWord is a confirmed final record as the host's `cancel --json`
// gives it.
type finalWord struct {
	state, cause string
	code         int
}

// cancelAnswer is the part of `cancel --json`'s object the controller
// reads (cli's cancelAnswer writes it).
type cancelAnswer struct {
	RunID     string `json:"run_id"`
	Outcome   string `json:"outcome"`
	State     string `json:"state"`
	Cause     string `json:"cause"`
	ExitCode  *int   `json:"exit_code"`
	Survivors []int  `json:"survivors"`
}

// parseFinal reads the host's `cancel --json RUN_ID` answer, one JSON
// object. Only a confirmed (or already) terminal record of run id, with an
// exit code and no survivors, is taken; anything else is left to reconcile.
func parseFinal(id, out string) (finalWord, bool) {
	var a cancelAnswer
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &a); err != nil {
		return finalWord{}, false
	}
	if a.RunID != id || a.ExitCode == nil || a.Survivors == nil || len(a.Survivors) > 0 {
		return finalWord{}, false
	}
	switch a.Outcome {
	case "confirmed", "already":
	default:
		return finalWord{}, false
	}
	switch a.State {
	case "finished", "cancelled", "launch_failed":
	default:
		return finalWord{}, false
	}
	return finalWord{state: a.State, cause: a.Cause, code: *a.ExitCode}, true
}
