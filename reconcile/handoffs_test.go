package reconcile

import (
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

// The verdict names the run's handoffs; an unconfirmed one, or one still
// running when nothing on this host supervises it, is named with the owner
// of its remaining work; none changes this run's outcome.
func TestDecideHandoffs(t *testing.T) {
	code := 143
	done := statusfile.Handoff{RunID: "b1", Dest: "hostb", Outcome: "cancelled", ExitCode: &code, Learned: statusfile.HandoffByController}
	lost := statusfile.Handoff{RunID: "b2", Dest: "hostb", Outcome: statusfile.HandoffUnknown, Learned: statusfile.HandoffUnconfirmed,
		LeaseEndsAt: "2026-12-02T12:01:00Z"}
	live := statusfile.Handoff{RunID: "b3", Dest: "hostc", Outcome: statusfile.HandoffRunning, LeaseEndsAt: "2026-12-02T12:02:00Z"}

	with := func(r *statusfile.Record, hs ...statusfile.Handoff) *statusfile.Record {
		r.Handoffs = hs
		return r
	}
	tests := []struct {
		name    string
		in      Input
		outcome string
		want    []string
		not     []string
	}{
		{"cancelled/confirmed", Input{Record: with(record(statusfile.Cancelled, statusfile.CauseCancel, 143), done)},
			Cancelled, []string{"b1 on hostb (cancelled)"}, []string{"remaining work"}},
		{"cancelled/unconfirmed", Input{Record: with(record(statusfile.Cancelled, statusfile.CauseCancel, 143), done, lost)},
			Cancelled, []string{"remaining work elsewhere: run b2 on hostb, lease ends at 2026-12-02T12:01:00Z, settle with 'agent-wrap settle b2'"}, []string{"b1"}},
		{"running/supervised", Input{Record: with(record(statusfile.Running, "", 0), live), WrapperAlive: true},
			Running, []string{"b3 on hostc (running)"}, []string{"remaining work"}},
		{"wrapper-gone/handoff-running", Input{Record: with(record(statusfile.Running, "", 0), live)},
			Unknown, []string{"remaining work elsewhere: run b3 on hostc, lease ends at 2026-12-02T12:02:00Z", "was running when the record was last written"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			v := Decide(tc.in)
			if v.Outcome != tc.outcome {
				t.Errorf("outcome %s, want %s (reason %q)", v.Outcome, tc.outcome, v.Reason)
			}
			if len(v.Handoffs) != len(tc.in.Record.Handoffs) {
				t.Errorf("verdict handoffs %+v, want the record's %+v", v.Handoffs, tc.in.Record.Handoffs)
			}
			for _, s := range tc.want {
				if !strings.Contains(v.Reason, s) {
					t.Errorf("reason %q lacks %q", v.Reason, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(v.Reason, s) {
					t.Errorf("reason %q has %q", v.Reason, s)
				}
			}
		})
	}
	// A run without handoffs is judged as before: no field, no words.
	v := Decide(Input{Record: record(statusfile.Finished, "", 0), Now: now})
	if v.Handoffs != nil || strings.Contains(v.Reason, "handed on") {
		t.Errorf("no handoffs: %+v", v)
	}
}
