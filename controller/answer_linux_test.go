package controller

import (
	"testing"

	"github.com/agent-wrap/agent-wrap/answer"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// The host's real `cancel --json` output decodes into answer.Cancel with
// the outcome and statusfile's state and cause, and the controller's
// reading of that same output (parseFinal) takes exactly the final words:
// a confirmed cancel, an already cancelled run, a run that finished on its
// own; not a cancel of no such run.
func TestCancelAnswerRoundTrip(t *testing.T) {
	root := runtest.NewRoot(t)
	runtest.LiveAndFinished(t, root, "live1", "done1")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		want   answer.Cancel // Survivors, ExitCode checked apart
		exit   int
		final  finalWord
		isWord bool
	}{
		{"confirmed", []string{"cancel", "--json", "--wait", "30s", "live1"}, 0,
			answer.Cancel{RunID: "live1", Outcome: answer.Confirmed, State: statusfile.Cancelled, Cause: statusfile.CauseCancel},
			exitcode.TERM, finalWord{statusfile.Cancelled, statusfile.CauseCancel, exitcode.TERM}, true},
		{"already cancelled", []string{"cancel", "--json", "live1"}, 0,
			answer.Cancel{RunID: "live1", Outcome: answer.Already, State: statusfile.Cancelled, Cause: statusfile.CauseCancel},
			exitcode.TERM, finalWord{statusfile.Cancelled, statusfile.CauseCancel, exitcode.TERM}, true},
		{"already finished", []string{"cancel", "--json", "done1"}, 0,
			answer.Cancel{RunID: "done1", Outcome: answer.Already, State: statusfile.Finished},
			3, finalWord{statusfile.Finished, "", 3}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runtest.Exec(t, root, tc.args...)
			if code != tc.code {
				t.Fatalf("%v: exit %d, want %d\n%s%s", tc.args, code, tc.code, out, errs)
			}
			a, err := answer.ParseCancel(out)
			if err != nil {
				t.Fatalf("%v: %v\n%s", tc.args, err, out)
			}
			if a.ExitCode == nil || *a.ExitCode != tc.exit {
				t.Errorf("exit_code = %v, want %d\n%s", a.ExitCode, tc.exit, out)
			}
			if a.Survivors == nil || len(a.Survivors) != 0 {
				t.Errorf("survivors = %#v, want [] (the promise)\n%s", a.Survivors, out)
			}
			if a.RunID != tc.want.RunID || a.Outcome != tc.want.Outcome || a.State != tc.want.State || a.Cause != tc.want.Cause || a.Reason != "" {
				t.Errorf("decoded %+v, want %+v\n%s", a, tc.want, out)
			}
			if !a.Final(tc.want.RunID) {
				t.Errorf("Final(%q) = false for %s", tc.want.RunID, out)
			}
			fw, ok := parseFinal(tc.want.RunID, out)
			if ok != tc.isWord || fw != tc.final {
				t.Errorf("parseFinal = %+v, %v; want %+v, %v\n%s", fw, ok, tc.final, tc.isWord, out)
			}
			// Another run's answer is never taken for this one's.
			if _, ok := parseFinal("other", out); ok {
				t.Errorf("parseFinal took %s as run other's final word", out)
			}
		})
	}
	runtest.Run{Root: root, ID: "live1"}.AssertGroupEmpty(t)

	// No such run: 66 and no object, which the controller does not take.
	code, out, _ := runtest.Exec(t, root, "cancel", "--json", "nosuch")
	if code != exitcode.NoInput {
		t.Errorf("cancel --json nosuch: exit %d, want %d", code, exitcode.NoInput)
	}
	if _, ok := parseFinal("nosuch", out); ok || out != "" {
		t.Errorf("cancel --json nosuch printed %q, taken as final: %v", out, ok)
	}
}
