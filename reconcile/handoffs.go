package reconcile

import (
	"fmt"
	"strings"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

// withHandoffs names the run's handoffs (the runs its job started on other
// hosts with `agent-wrap ssh`, as its record lists them) in the verdict.
// They do not change the outcome of this run, which is about this host; a
// handoff whose end is not confirmed is named in the reason with the owner
// of its remaining work (its lease on its host, and settle). One recorded
// running is live work only while this run's wrapper is alive to stop it;
// otherwise it is named the same way.
func withHandoffs(v Verdict, rec *statusfile.Record) Verdict {
	if rec == nil || len(rec.Handoffs) == 0 {
		return v
	}
	v.Handoffs = rec.Handoffs
	var open []string
	for _, h := range rec.Handoffs {
		switch {
		case h.Outcome == statusfile.HandoffUnknown:
			open = append(open, h.RemainingWork())
		case h.Outcome == statusfile.HandoffRunning && v.Supervisor != SupervisorAlive:
			open = append(open, h.RemainingWork()+" (it was running when the record was last written)")
		}
	}
	if len(open) > 0 {
		v.Reason += "; remaining work elsewhere: " + strings.Join(open, "; ")
	} else {
		v.Reason += fmt.Sprintf("; %d run(s) it handed on to other hosts: %s", len(rec.Handoffs), describeHandoffs(rec.Handoffs))
	}
	return v
}

// describeHandoffs is "b7 on host (cancelled), c1 on other (running)".
func describeHandoffs(hs []statusfile.Handoff) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%s on %s (%s)", h.RunID, h.Dest, h.Outcome)
	}
	return strings.Join(parts, ", ")
}
