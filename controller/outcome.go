package controller

import (
	"fmt"
	"strings"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// The one rule for what the ledger records of a run's end: from what the
// controller knows (the attach's or the launch's exit code, a cancel's
// confirmation, the host's verdict and how the call for it ended) to an
// outcome, exit code, cause and reason. Follow's end (finish), a launch
// that failed without the run's record (launchFailed) and Settle all ask
// judge; none maps a verdict on its own.

// judgedAt is where a run's end is judged.
type judgedAt int

const (
	// atEnd: Follow, the run's attach (or its launch connection, after
	// the record) ended with code. The run was launched.
	atEnd judgedAt = iota
	// atLaunch: Follow, a launch ended without the run's record, exiting
	// code. The run was never seen to start.
	atLaunch
	// atSettle: Settle, on the ledger's record (state), its controller
	// gone.
	atSettle
)

// facts is what is known when a run's end is judged.
type facts struct {
	at     judgedAt
	code   int        // the attach's (atEnd) or the launch's (atLaunch) exit code; atSettle: -1
	cancel bool       // atEnd: a cancel was asked for
	final  *finalWord // atEnd: that cancel's confirmed final record, nil when none came
	state  string     // atSettle: the ledger's state (launching: never seen running)

	// The host's verdict: asked says reconcile was asked, v is its
	// verdict (nil when none came) and res how the call ended.
	asked bool
	v     *reconcile.Verdict
	res   transport.Result

	dest, bin string // the destination and remote agent-wrap, for the reasons
	said      string // atLaunch: what the host said instead of a record
}

// nextStep is what the caller of judge does next.
type nextStep int

const (
	// doSettle: record outcome, code, cause and reason (settled).
	doSettle nextStep = iota
	// doAsk: ask the host for its verdict (reconcile) and judge again.
	doAsk
	// doRetry: the host could not be asked. Follow asks again until
	// --give-up; Settle answers unreachable (reason says why).
	doRetry
	// doFollow: the run is live. Follow follows it again; Settle answers
	// running (reason is the verdict's).
	doFollow
	// doLeave: no verdict to record. Follow leaves the run unsettled for
	// settle, outcome unknown (255), saying reason (written to the record
	// when record is set); Settle answers unreachable.
	doLeave
)

// judgment is judge's answer.
type judgment struct {
	next    nextStep
	outcome string // doSettle: ledger.Completed, Cancelled, NotStarted or Unknown
	code    int    // doSettle: the recorded exit code; -1: none
	cause   string
	reason  string
	// exit is Follow's exit code (doSettle, doLeave): the run's code, the
	// launch's, 127 for no agent-wrap on the host, 255 when the outcome is
	// unknown. Settle's code comes from next and outcome instead.
	exit int
	// record: doLeave writes reason into the unsettled record.
	record bool
	// notStarted: Follow says "not started: reason", with hint when set.
	notStarted bool
	hint       string
	// noAttach: the attach's 64 was its own usage error, not the run's
	// code: the host's agent-wrap has no attach (Follow says so once and
	// follows with wait).
	noAttach bool
}

// noSuchRun reports whether the host answered that it has no run of the
// ID: reconcile's 66, which comes without a verdict (for one ID, reconcile
// prints either a verdict or 66, never both).
func noSuchRun(v *reconcile.Verdict, res transport.Result) bool {
	return v == nil && res.Code == exitcode.NoInput
}

// noAgentWrap reports whether the host has no agent-wrap where the record
// says: the shell's 127 for the reconcile command itself.
func noAgentWrap(v *reconcile.Verdict, res transport.Result) bool {
	return v == nil && res.Code == exitcode.NotFound
}

// unambiguous reports whether an attach's exit code can only be the run's
// own code of a finished run: not a code agent-wrap uses for itself, nor
// one a cancel gives (exitcode.Confirm: the table's rows say which).
func unambiguous(code int) bool { return !exitcode.Confirm(code) }

// judge decides what a run's end means for the ledger. It makes no call
// and reads nothing: the caller asks the host when told doAsk, and acts on
// the rest.
func judge(f facts) judgment {
	if !f.asked {
		return judgeUnasked(f)
	}
	v, res := f.v, f.res
	switch {
	case res.Lost() && f.at == atLaunch:
		// A launch failed and the host cannot be asked why: Follow does
		// not retry (the launch's own retries are over), it leaves the
		// run for settle, saying what is known.
		return leave(true, fmt.Sprintf("launch exited %d and the host gave no verdict (%s)", f.code, res.Why()))
	case res.Lost():
		return judgment{next: doRetry, reason: fmt.Sprintf("cannot reach %s: %s", f.dest, res.Why())}
	case v != nil && (v.Outcome == reconcile.Completed || v.Outcome == reconcile.Cancelled):
		return judgeDecided(f)
	case noAgentWrap(v, res) && f.at == atLaunch:
		reason := fmt.Sprintf("%s has no agent-wrap at %q", f.dest, f.bin)
		return judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: reason, exit: exitcode.NotFound,
			notStarted: true, hint: fmt.Sprintf("install it there with 'agent-wrap deploy %s', or name it with --remote-bin PATH", f.dest)}
	case noAgentWrap(v, res) && f.at == atSettle:
		return leave(false, fmt.Sprintf("%s has no agent-wrap at %q (exit %d)", f.dest, f.bin, exitcode.NotFound))
	case noSuchRun(v, res) && f.at == atLaunch:
		reason := fmt.Sprintf("the host refused the launch (exit %d)", f.code)
		if s := strings.TrimSpace(f.said); s != "" {
			reason += ": " + lastLine(s)
		}
		j := judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: reason, exit: f.code}
		if strings.Contains(f.said, "unknown flag: --stdin") {
			// A host older than the job's stdin (stdin.go).
			j.notStarted = true
			j.hint = fmt.Sprintf("the agent-wrap on %s is older than this controller and cannot feed the job's stdin: 'agent-wrap deploy %s' installs this version, or give -n (the job's stdin is then /dev/null)", f.dest, f.dest)
		}
		return j
	case noSuchRun(v, res) && f.at == atSettle && f.state == ledger.Launching:
		return judgment{next: doSettle, outcome: ledger.NotStarted, code: -1, reason: "the host has no run of this ID: it was never started"}
	case noSuchRun(v, res) && f.at == atSettle:
		return judgment{next: doSettle, outcome: ledger.Unknown, code: -1, reason: "the host has no run of this ID, though it was seen " + f.state}
	case v == nil && f.at == atLaunch:
		return leave(true, fmt.Sprintf("launch exited %d and the host gave no verdict (%s)", f.code, res.Why()))
	case v == nil:
		return leave(false, fmt.Sprintf("reconcile on %s exited %d without a verdict", f.dest, res.Code))
	case f.at == atLaunch && f.code == exitcode.TempFail:
		// The ID is there but not ours to have started: a live or unknown
		// run (the launch's 75). It was not started by this call.
		return judgment{next: doSettle, outcome: ledger.NotStarted, code: -1,
			reason: fmt.Sprintf("run ID already in use on %s (%s)", f.dest, v.Outcome), exit: f.code, notStarted: true}
	case f.at == atLaunch:
		// The launch ended some other way (its wrapper killed while
		// starting, say) and the host has a run of the ID that is live or
		// cannot be judged yet: this launch claimed it, so it is not
		// not_started. Left for settle, which asks again once the host
		// (its watchdog) has ended it.
		return leave(true, fmt.Sprintf("launch exited %d and the host's run of this ID is %s: %s", f.code, v.Outcome, v.Reason))
	case v.Outcome == reconcile.Running:
		// The attach ended early (75 from wait's timeout, a 64 from an
		// agent-wrap without attach): the run goes on.
		return judgment{next: doFollow, reason: v.Reason, noAttach: f.at == atEnd && f.code == exitcode.Usage}
	}
	return judgment{next: doSettle, outcome: ledger.Unknown, code: -1, cause: v.Evidence.Cause, reason: v.Reason, exit: exitcode.Lost}
}

// judgeUnasked answers before the host is asked: an attach's code that
// can only be the run's own is its outcome; a cancel's confirmation with
// the attach's code names the final state and cause. Anything else needs
// the host's verdict.
func judgeUnasked(f facts) judgment {
	if f.at != atEnd {
		return judgment{next: doAsk}
	}
	if !f.cancel && unambiguous(f.code) {
		return judgment{next: doSettle, outcome: ledger.Completed, code: f.code, exit: f.code}
	}
	if f.cancel && f.final != nil && f.final.code == f.code {
		outcome := ledger.Completed
		if f.final.state == statusfile.Cancelled {
			outcome = ledger.Cancelled
		}
		return judgment{next: doSettle, outcome: outcome, code: f.code, cause: f.final.cause, exit: f.code}
	}
	return judgment{next: doAsk}
}

// judgeDecided records a completed or cancelled verdict: the verdict's
// code, else the one the controller saw (none at settle).
func judgeDecided(f facts) judgment {
	v := f.v
	c := f.code
	if v.ExitCode != nil {
		c = *v.ExitCode
	}
	j := judgment{next: doSettle, outcome: v.Outcome, code: c, cause: v.Evidence.Cause, exit: c}
	if f.at == atLaunch {
		// The run's record never reached the controller: the verdict's
		// reason (the launch failure, say) is the ledger's only account
		// of it.
		j.reason = v.Reason
	}
	if f.at == atEnd && f.code == exitcode.Usage && c != exitcode.Usage {
		j.noAttach = true // a usage error that was not the run's code
	}
	return j
}

func leave(record bool, reason string) judgment {
	return judgment{next: doLeave, code: -1, reason: reason, exit: exitcode.Lost, record: record}
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
