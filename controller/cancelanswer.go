package controller

import "github.com/agent-wrap/agent-wrap/answer"

// finalWord is a confirmed final record as the host's `cancel --json`
// gives it.
type finalWord struct {
	state, cause string
	code         int
}

// parseFinal reads the host's `cancel --json RUN_ID` answer, one JSON
// object. Only a confirmed (or already) terminal record of run id, with an
// exit code and no survivors, is taken (answer.Cancel.Final); anything else
// is left to reconcile.
func parseFinal(id, out string) (finalWord, bool) {
	a, err := answer.ParseCancel(out)
	if err != nil || !a.Final(id) {
		return finalWord{}, false
	}
	return finalWord{state: a.State, cause: a.Cause, code: *a.ExitCode}, true
}
