package controller

import "time"

// CancelGrace is Cancel with a grace for the host's cancel: the time
// between TERM and KILL where the host's `cancel` stops the run itself
// (its wrapper is gone). A live wrapper stops its run with the run's own
// grace (Config.Grace), as it does for any cancel. grace <= 0 is Cancel.
// The first grace given before the remote cancel is sent is the one sent.
func (r *Run) CancelGrace(grace time.Duration) {
	if grace > 0 {
		r.cancelGrace.CompareAndSwap(0, int64(grace))
	}
	r.Cancel()
}

// cancelWords is the remote cancel's command line: --json first (an
// older host's refusal of it is recognised by cancelLoop), then the wait,
// the grace asked by CancelGrace, and the run ID.
func (r *Run) cancelWords(wait time.Duration) []string {
	words := []string{"cancel", "--json", "--wait", wait.String()}
	if g := time.Duration(r.cancelGrace.Load()); g > 0 {
		words = append(words, "--grace", g.String())
	}
	return append(words, r.cfg.ID)
}
