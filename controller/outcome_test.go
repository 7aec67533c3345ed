package controller

import (
	"testing"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// verdict is a host's verdict as reconcile --json gives it; code < 0: no
// exit code in it.
func verdict(outcome string, code int, cause, reason string) *reconcile.Verdict {
	v := &reconcile.Verdict{RunID: "r1", Outcome: outcome, Reason: reason}
	v.Evidence.Cause = cause
	if code >= 0 {
		v.ExitCode = &code
	}
	return v
}

// answered is how the reconcile call ended when it gave v: reconcile's
// own exit code for that outcome.
func answered(v *reconcile.Verdict) transport.Result {
	return transport.Result{Code: reconcile.OutcomeExit(v.Outcome)}
}

var (
	lostCall = transport.Result{Code: exitcode.Lost, SSHLog: "Connection closed by 127.0.0.1 port 22"}
	noRun    = transport.Result{Code: exitcode.NoInput}
	noBin    = transport.Result{Code: exitcode.NotFound}
)

// asked returns f with the host's answer.
func asked(f facts, v *reconcile.Verdict, res transport.Result) facts {
	f.asked, f.v, f.res = true, v, res
	return f
}

func TestJudge(t *testing.T) {
	end := func(code int) facts { return facts{at: atEnd, code: code, dest: "h", bin: "agent-wrap"} }
	cancelled := func(code int, final *finalWord) facts {
		f := end(code)
		f.cancel, f.final = true, final
		return f
	}
	launch := func(code int, said string) facts {
		return facts{at: atLaunch, code: code, dest: "h", bin: "/opt/aw", said: said}
	}
	settle := func(state string) facts {
		return facts{at: atSettle, code: -1, state: state, dest: "h", bin: "/opt/aw"}
	}
	completed := verdict(reconcile.Completed, 0, "", "the job finished with exit code 0")
	cancelledV := verdict(reconcile.Cancelled, exitcode.TERM, "cancel", "cancelled (cause cancel, exit code 143); no process of the run is alive")
	running := verdict(reconcile.Running, -1, "", "its wrapper (PID 7) is alive; the run is running")
	unknown := verdict(reconcile.Unknown, -1, "", "host rebooted since the run started")
	launchFailedV := verdict(reconcile.Completed, exitcode.NotFound, "", "launch failed with exit code 127: exec: \"nosuch\": not found")

	rows := []struct {
		name string
		f    facts
		want judgment
		why  string
	}{
		// Follow, the attach ended: before the host is asked.
		{"end/own code", end(0), judgment{next: doSettle, outcome: ledger.Completed, code: 0, exit: 0},
			"0-123 are the job's own codes: no agent-wrap command and no cancel gives them, so the attach's code is the outcome"},
		{"end/signal", end(exitcode.Signal(9)), judgment{next: doSettle, outcome: ledger.Completed, code: 137, exit: 137},
			"128+N for a signal no cancel sends is the leader's death, the run's own code"},
		{"end/cancel's code, no cancel asked", end(exitcode.TERM), judgment{next: doAsk},
			"143 is also what a cancel gives (another controller's, the host's own): the host says whether it was cancelled, and why"},
		{"end/lease", end(exitcode.Lease), judgment{next: doAsk},
			"124 is the lease's: the cause is the host's to give"},
		{"end/tempfail", end(exitcode.TempFail), judgment{next: doAsk},
			"75 is wait's timeout (an agent-wrap without attach): the run may be live"},
		{"end/usage", end(exitcode.Usage), judgment{next: doAsk},
			"64 may be the job's or an agent-wrap without attach refusing the command"},
		{"cancel/no confirmation", cancelled(0, nil), judgment{next: doAsk},
			"a cancel raced the end and its answer did not come: the host says whether the run finished or was cancelled"},
		{"cancel/confirmed cancelled", cancelled(exitcode.TERM, &finalWord{state: statusfile.Cancelled, cause: statusfile.CauseCancel, code: exitcode.TERM}),
			judgment{next: doSettle, outcome: ledger.Cancelled, code: 143, cause: "cancel", exit: 143},
			"the cancel's confirmation names the final record the attach ended with: cancelled, its cause"},
		{"cancel/confirmed finished", cancelled(0, &finalWord{state: statusfile.Finished, code: 0}),
			judgment{next: doSettle, outcome: ledger.Completed, code: 0, exit: 0},
			"the job finished before the cancel reached it: the confirmation says finished, so completed"},
		{"cancel/confirmed launch_failed", cancelled(exitcode.NotFound, &finalWord{state: statusfile.LaunchFailed, cause: "", code: exitcode.NotFound}),
			judgment{next: doSettle, outcome: ledger.Completed, code: 127, exit: 127},
			"a launch that failed is completed with its code, as reconcile judges it"},
		{"cancel/confirmation of another end", cancelled(0, &finalWord{state: statusfile.Cancelled, cause: statusfile.CauseCancel, code: exitcode.TERM}),
			judgment{next: doAsk},
			"the confirmation's code is not the attach's: they do not speak of the same end, the host decides"},

		// Follow, the attach ended: the host's verdict.
		{"end/lost", asked(end(exitcode.TERM), nil, lostCall), judgment{next: doRetry, reason: "cannot reach h: Connection closed by 127.0.0.1 port 22"},
			"no answer is no verdict: Follow asks again until --give-up"},
		{"end/cancelled", asked(end(exitcode.TERM), cancelledV, answered(cancelledV)),
			judgment{next: doSettle, outcome: ledger.Cancelled, code: 143, cause: "cancel", exit: 143},
			"the verdict's outcome, code and cause are recorded; its reason is not (the record's fields say it)"},
		{"end/verdict without a code", asked(end(exitcode.Lease), verdict(reconcile.Cancelled, -1, "lease", ""), transport.Result{}),
			judgment{next: doSettle, outcome: ledger.Cancelled, code: 124, cause: "lease", exit: 124},
			"a verdict without a code keeps the one the attach saw"},
		{"end/64 was attach's", asked(end(exitcode.Usage), completed, answered(completed)),
			judgment{next: doSettle, outcome: ledger.Completed, code: 0, exit: 0, noAttach: true},
			"the run completed 0 yet the attach said 64: the 64 was the host's agent-wrap refusing attach"},
		{"end/64 was the run's", asked(end(exitcode.Usage), verdict(reconcile.Completed, exitcode.Usage, "", ""), transport.Result{}),
			judgment{next: doSettle, outcome: ledger.Completed, code: 64, exit: 64},
			"the run's own code was 64: attach works"},
		{"end/live", asked(end(exitcode.TempFail), running, answered(running)), judgment{next: doFollow, reason: running.Reason},
			"wait's 75 at its timeout: the run goes on, Follow follows it again"},
		{"end/live after 64", asked(end(exitcode.Usage), running, answered(running)),
			judgment{next: doFollow, reason: running.Reason, noAttach: true},
			"a live run cannot have exited 64: the 64 was attach's, so the host has none"},
		{"end/unknown", asked(end(exitcode.TERM), unknown, answered(unknown)),
			judgment{next: doSettle, outcome: ledger.Unknown, code: -1, reason: unknown.Reason, exit: 255},
			"the host cannot say: recorded unknown with its reason, and Follow exits 255"},
		{"end/no such run", asked(end(exitcode.TERM), nil, noRun),
			judgment{next: doLeave, code: -1, reason: "reconcile on h exited 66 without a verdict", exit: 255},
			"a run that was seen running cannot be not_started: Follow leaves it, and settle records what the host says then"},
		{"end/no agent-wrap", asked(end(exitcode.TERM), nil, noBin),
			judgment{next: doLeave, code: -1, reason: "reconcile on h exited 127 without a verdict", exit: 255},
			"the agent-wrap that streamed the run is gone from its path: nothing is known of the end"},
		{"end/no verdict", asked(end(exitcode.TERM), nil, transport.Result{Code: 1}),
			judgment{next: doLeave, code: -1, reason: "reconcile on h exited 1 without a verdict", exit: 255},
			"an answer that is not a verdict: nothing to record"},

		// Follow, a launch ended without the run's record.
		{"launch/unasked", launch(exitcode.Usage, ""), judgment{next: doAsk},
			"without a record only the host can say what the launch did"},
		{"launch/launch failed", asked(launch(exitcode.NotFound, ""), launchFailedV, answered(launchFailedV)),
			judgment{next: doSettle, outcome: ledger.Completed, code: 127, reason: launchFailedV.Reason, exit: 127},
			"the host claimed the run and its command was not found: completed with the verdict's code, and its reason kept, the ledger's only account of the failure"},
		{"launch/cancelled", asked(launch(exitcode.TERM, ""), cancelledV, answered(cancelledV)),
			judgment{next: doSettle, outcome: ledger.Cancelled, code: 143, cause: "cancel", reason: cancelledV.Reason, exit: 143},
			"a run the host claimed and cancelled before the record came: its verdict, reason kept"},
		{"launch/no agent-wrap", asked(launch(exitcode.NotFound, ""), nil, noBin),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: `h has no agent-wrap at "/opt/aw"`, exit: 127,
				notStarted: true, hint: "install it there with 'agent-wrap deploy h', or name it with --remote-bin PATH"},
			"the shell could not find agent-wrap for reconcile either: no agent-wrap, so this launch started nothing; 127, as a command not found"},
		{"launch/refused", asked(launch(exitcode.Usage, "agent-wrap: error: unknown flag: --agent\nhint: see 'agent-wrap run --help'\n"), nil, noRun),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "the host refused the launch (exit 64): hint: see 'agent-wrap run --help'", exit: 64},
			"the host has no run of the ID: agent-wrap refused before claiming it (its message was relayed); the launch's code is Follow's"},
		{"launch/host without --stdin", asked(launch(exitcode.Usage, "agent-wrap: run: unknown flag: --stdin\nagent-wrap: hint: see 'agent-wrap run --help'\n"), nil, noRun),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "the host refused the launch (exit 64): agent-wrap: hint: see 'agent-wrap run --help'", exit: 64,
				notStarted: true, hint: "the agent-wrap on h is older than this controller and cannot feed the job's stdin: 'agent-wrap deploy h' installs this version, or give -n (the job's stdin is then /dev/null)"},
			"an agent-wrap older than run --stdin refuses the flag before any claim: not started, with the two ways on"},
		{"launch/refused silently", asked(launch(exitcode.Config, ""), nil, noRun),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "the host refused the launch (exit 78)", exit: 78},
			"as refused, with nothing said to quote"},
		{"launch/ID in use", asked(launch(exitcode.TempFail, ""), running, answered(running)),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "run ID already in use on h (running)", exit: 75, notStarted: true},
			"a live run of the ID that this launch did not start (it refused, 75): not started by this call"},
		{"launch/ID of an unknown run", asked(launch(exitcode.TempFail, ""), unknown, answered(unknown)),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "run ID already in use on h (unknown)", exit: 75, notStarted: true},
			"the same for a run whose outcome is unknown"},
		{"launch/killed, run unknown", asked(launch(137, ""), unknown, answered(unknown)),
			judgment{next: doLeave, code: -1, reason: "launch exited 137 and the host's run of this ID is unknown: host rebooted since the run started", exit: 255, record: true},
			"a launch killed while starting (not the 75 of an ID in use) claimed the ID: the host's run is this one, not not_started; left for settle (chaos seed 513)"},
		{"launch/killed, run running", asked(launch(137, ""), running, answered(running)),
			judgment{next: doLeave, code: -1, reason: "launch exited 137 and the host's run of this ID is running: its wrapper (PID 7) is alive; the run is running", exit: 255, record: true},
			"the same for a run still live"},
		{"launch/lost", asked(launch(exitcode.Software, ""), nil, lostCall),
			judgment{next: doLeave, code: -1, reason: "launch exited 70 and the host gave no verdict (Connection closed by 127.0.0.1 port 22)", exit: 255, record: true},
			"the launch failed and the host cannot be asked: left launching, the reason in the record for settle"},
		{"launch/no verdict", asked(launch(exitcode.Software, ""), nil, transport.Result{Code: 1}),
			judgment{next: doLeave, code: -1, reason: "launch exited 70 and the host gave no verdict (ssh exited 1)", exit: 255, record: true},
			"an answer that is not a verdict: the same"},

		// Settle, the controller gone.
		{"settle/unasked", settle(ledger.Running), judgment{next: doAsk}, "settle always asks the host"},
		{"settle/lost", asked(settle(ledger.Detached), nil, lostCall),
			judgment{next: doRetry, reason: "cannot reach h: Connection closed by 127.0.0.1 port 22"},
			"unreachable: nothing changes, settle may be run again"},
		{"settle/never started", asked(settle(ledger.Launching), nil, noRun),
			judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "the host has no run of this ID: it was never started"},
			"the ledger never saw it start and the host has no run of the ID (a claim is atomic): not started"},
		{"settle/gone after running", asked(settle(ledger.Running), nil, noRun),
			judgment{next: doSettle, outcome: ledger.Unknown, code: -1, reason: "the host has no run of this ID, though it was seen running"},
			"a run seen running cannot have not started: its record is gone (gc, another root), so unknown"},
		{"settle/gone after a cancel", asked(settle(ledger.CancelRequested), nil, noRun),
			judgment{next: doSettle, outcome: ledger.Unknown, code: -1, reason: "the host has no run of this ID, though it was seen cancel_requested"},
			"cancel_requested may be a cancel before the launch, but settle cannot tell: only launching proves nothing was seen"},
		{"settle/no agent-wrap", asked(settle(ledger.Launching), nil, noBin),
			judgment{next: doLeave, code: -1, reason: `h has no agent-wrap at "/opt/aw" (exit 127)`, exit: 255},
			"no agent-wrap to ask is no verdict: unreachable, nothing recorded (it may have been removed after the launch)"},
		{"settle/no verdict", asked(settle(ledger.Detached), nil, transport.Result{Code: exitcode.Config}),
			judgment{next: doLeave, code: -1, reason: "reconcile on h exited 78 without a verdict", exit: 255},
			"an answer that is not a verdict: unreachable"},
		{"settle/live", asked(settle(ledger.Detached), running, answered(running)), judgment{next: doFollow, reason: running.Reason},
			"the run is still running: settle leaves it, and says the host's reason"},
		{"settle/completed", asked(settle(ledger.Detached), verdict(reconcile.Completed, 3, "", "the job finished with exit code 3"), transport.Result{}),
			judgment{next: doSettle, outcome: ledger.Completed, code: 3, exit: 3},
			"the verdict's outcome and code; its reason is not recorded, as at Follow's end"},
		{"settle/verdict without a code", asked(settle(ledger.Detached), verdict(reconcile.Cancelled, -1, "lease", ""), transport.Result{}),
			judgment{next: doSettle, outcome: ledger.Cancelled, code: -1, cause: "lease", exit: -1},
			"settle saw no code of its own: none is recorded"},
		{"settle/unknown", asked(settle(ledger.Detached), unknown, answered(unknown)),
			judgment{next: doSettle, outcome: ledger.Unknown, code: -1, reason: unknown.Reason, exit: 255},
			"the host cannot say: recorded unknown with its reason (settle exits 4)"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if got := judge(r.f); got != r.want {
				t.Errorf("judge =\n  %+v\nwant\n  %+v\nbecause %s", got, r.want, r.why)
			}
		})
	}
}

func TestUnambiguous(t *testing.T) {
	for code, want := range map[int]bool{0: true, 2: true, 7: true, 137: true, 1: false, 66: false, 75: false, 124: false, 127: false, 143: false, 130: false} {
		if unambiguous(code) != want {
			t.Errorf("unambiguous(%d) = %v", code, !want)
		}
	}
}
