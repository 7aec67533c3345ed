package controller

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agent-wrap/agent-wrap/ledger"
)

// The states a run can reach (TestRunStateEveryTransition checks that
// these are all of them).
var (
	stLaunching    = runState{}
	stLaunchingC   = runState{phase: phaseLaunching, cancel: true} // a cancelled launch left to settle
	stCancelFirst  = runState{phase: phaseCancelRequested, cancel: true}
	stRunning      = runState{phase: phaseRunning, launched: true}
	stDetached     = runState{phase: phaseDetached, launched: true}
	stDetachedC    = runState{phase: phaseDetached, launched: true, cancel: true}
	stCancel       = runState{phase: phaseCancelRequested, launched: true, cancel: true}
	stSettlingL    = runState{phase: phaseSettling}
	stSettlingLC   = runState{phase: phaseSettling, cancel: true}
	stSettling     = runState{phase: phaseSettling, launched: true}
	stSettlingC    = runState{phase: phaseSettling, launched: true, cancel: true}
	stSettledL     = runState{phase: phaseSettled}
	stSettledLC    = runState{phase: phaseSettled, cancel: true}
	stSettled      = runState{phase: phaseSettled, launched: true}
	stSettledC     = runState{phase: phaseSettled, launched: true, cancel: true}
	everyRunEvents = []runEvent{onLaunched, onLost, onAttached, onCancel, onEnded, onLive, onGiveUp, onSettle}
)

// allowed is every transition next allows, each with why. Any other
// (state, event) pair of a reachable state is refused.
var allowed = []struct {
	from runState
	e    runEvent
	to   runState
	why  string
}{
	// launching
	{stLaunching, onLaunched, stRunning, "the run's record arrived: the host has it and the launch connection streams it"},
	{stLaunching, onLost, stLaunching, "a lost launch attempt: nothing was seen to start, so the ledger keeps launching and the launch is retried"},
	{stLaunching, onCancel, stCancelFirst, "a cancel before the launch reached the host: cancel_requested, not launched"},
	{stLaunching, onEnded, stSettlingL, "the launch ended without a record (refused, no agent-wrap): its outcome is asked"},
	{stLaunching, onGiveUp, stLaunching, "--give-up with the host never reached: left launching, for settle to find not started"},
	{stLaunching, onSettle, stSettledL, "ssh cannot connect for good, or the outer run refused it: not started, settled at once"},
	{stLaunchingC, onLaunched, stCancel, "a give-up of a cancelled launch is final for the controller, but should the run be seen it is a cancelled one"},
	{stLaunchingC, onLost, stLaunchingC, "never seen to start: a loss changes nothing"},
	{stLaunchingC, onEnded, stSettlingLC, "an end is judged like any launch's"},
	{stLaunchingC, onGiveUp, stLaunchingC, "giving up again changes nothing"},
	{stLaunchingC, onSettle, stSettledLC, "never launched: may be settled at once"},

	// cancel_requested before the launch reached the host
	{stCancelFirst, onLaunched, stCancel, "the launch reached the host after all: the cancel stays asked and is sent now"},
	{stCancelFirst, onLost, stCancelFirst, "a launch lost while cancelling: still not seen to start"},
	{stCancelFirst, onEnded, stSettlingLC, "the launch ended without a record while cancelling: its outcome is asked"},
	{stCancelFirst, onGiveUp, stLaunchingC, "the host could not be asked whether the cancelled launch reached it: left launching for settle"},
	{stCancelFirst, onSettle, stSettledLC, "no launch can have reached the host: not started, settled at once"},

	// running
	{stRunning, onLost, stDetached, "the stream's connection was lost: detached, reattach"},
	{stRunning, onCancel, stCancel, "Cancel: cancel_requested, and cancelLoop sends the remote cancel"},
	{stRunning, onEnded, stSettling, "the attach ended with a code: learn what it means"},
	{stRunning, onGiveUp, stDetached, "--give-up: left detached (the lease ends it on the host)"},

	// detached
	{stDetached, onLost, stDetached, "a reattach that failed: still detached"},
	{stDetached, onAttached, stRunning, "a reattach is up: running again"},
	{stDetached, onCancel, stCancel, "a cancel while detached is recorded at once: cancel_requested"},
	{stDetached, onEnded, stSettling, "an end is learned whatever came before it"},
	{stDetached, onGiveUp, stDetached, "--give-up while detached: stays detached, for settle"},
	{stDetachedC, onLost, stDetachedC, "a reattach failed while cancelling: still detached"},
	{stDetachedC, onAttached, stCancel, "a reattach is up after a cancel: back to cancel_requested, not running"},
	{stDetachedC, onEnded, stSettlingC, "an end is learned whatever came before it"},
	{stDetachedC, onGiveUp, stDetachedC, "--give-up while detached: stays detached, for settle"},

	// cancel_requested, launched
	{stCancel, onLost, stDetachedC, "the stream was lost while cancelling: detached, the cancel still asked"},
	{stCancel, onAttached, stCancel, "a reattach started while detached came up after the cancel: still cancel_requested"},
	{stCancel, onEnded, stSettlingC, "the attach ended (the cancel's final record): learn the outcome"},
	{stCancel, onGiveUp, stDetachedC, "--give-up while cancelling: detached, for settle"},

	// settling
	{stSettlingL, onCancel, stSettlingLC, "a cancel while a failed launch is judged: recorded, the judgment goes on"},
	{stSettlingL, onGiveUp, stLaunching, "no verdict for a launch that was never seen to start: launching, for settle"},
	{stSettlingL, onSettle, stSettledL, "the verdict of a failed launch is recorded"},
	{stSettlingLC, onGiveUp, stLaunchingC, "as without the cancel"},
	{stSettlingLC, onSettle, stSettledLC, "as without the cancel"},
	{stSettling, onCancel, stSettlingC, "a cancel while the outcome is learned: recorded, the learning goes on"},
	{stSettling, onLive, stRunning, "the host says the run is live (the attach ended early): follow it again"},
	{stSettling, onGiveUp, stDetached, "the host stayed away past --give-up: detached, for settle"},
	{stSettling, onSettle, stSettled, "the outcome is learned and recorded"},
	{stSettlingC, onLive, stCancel, "live again after a cancel: back to cancel_requested"},
	{stSettlingC, onGiveUp, stDetachedC, "the host stayed away past --give-up: detached, for settle"},
	{stSettlingC, onSettle, stSettledC, "the cancel's outcome is learned and recorded"},
}

func TestRunStateAllowed(t *testing.T) {
	for _, c := range allowed {
		t.Run(fmt.Sprintf("%v/%v", c.from, c.e), func(t *testing.T) {
			got, err := c.from.next(c.e)
			if err != nil || got != c.to {
				t.Errorf("next = %v, %v; want %v (%s)", got, err, c.to, c.why)
			}
		})
	}
}

// TestRunStateEveryTransition walks every state reachable from launching
// through every event: each pair the table does not allow is refused with
// the state unchanged, and every allowed pair is a row of the table (so a
// transition added to next without a row, or a state the list above does
// not name, fails here).
func TestRunStateEveryTransition(t *testing.T) {
	want := map[[2]any]runState{}
	for _, c := range allowed {
		want[[2]any{c.from, c.e}] = c.to
	}
	named := map[runState]bool{}
	for _, s := range []runState{stLaunching, stLaunchingC, stCancelFirst, stRunning, stDetached, stDetachedC, stCancel,
		stSettlingL, stSettlingLC, stSettling, stSettlingC, stSettledL, stSettledLC, stSettled, stSettledC} {
		named[s] = true
	}
	seen := map[runState]bool{stLaunching: true}
	queue := []runState{stLaunching}
	pairs := 0
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if !named[s] {
			t.Errorf("reachable state %v is not named in the test", s)
		}
		for _, e := range everyRunEvents {
			pairs++
			got, err := s.next(e)
			to, ok := want[[2]any{s, e}]
			switch {
			case ok && (err != nil || got != to):
				t.Errorf("%v on %v = %v, %v; want %v", s, e, got, err, to)
			case !ok && err == nil:
				t.Errorf("%v on %v moved to %v; the table has no such transition", s, e, got)
			case !ok:
				var r *errRefused
				if !errors.As(err, &r) || got != s {
					t.Errorf("%v on %v = %v, %v; want refused, unchanged", s, e, got, err)
				}
			}
			if err == nil && !seen[got] {
				seen[got] = true
				queue = append(queue, got)
			}
		}
	}
	if len(seen) != len(named) {
		t.Errorf("%d states reachable, %d named", len(seen), len(named))
	}
	if pairs != len(named)*len(everyRunEvents) {
		t.Errorf("walked %d pairs, want %d", pairs, len(named)*len(everyRunEvents))
	}
}

// TestRunStatePaths drives the run's stories event by event and checks
// the ledger's name after each step.
func TestRunStatePaths(t *testing.T) {
	type step struct {
		e      runEvent
		ledger string // "" : refused, state unchanged
	}
	paths := []struct {
		name  string
		steps []step
	}{
		{"completes", []step{{onLaunched, ledger.Running}, {onEnded, ledger.Running}, {onSettle, ledger.Settled}}},
		{"detached while launching", []step{{onLost, ledger.Launching}, {onLost, ledger.Launching}, {onAttached, ""},
			{onLaunched, ledger.Running}, {onEnded, ledger.Running}, {onSettle, ledger.Settled}}},
		{"reattach", []step{{onLaunched, ledger.Running}, {onLost, ledger.Detached}, {onLost, ledger.Detached},
			{onAttached, ledger.Running}, {onAttached, ""}, {onEnded, ledger.Running}, {onSettle, ledger.Settled}}},
		{"detached while cancel requested", []step{{onLaunched, ledger.Running}, {onCancel, ledger.CancelRequested},
			{onLost, ledger.Detached}, {onCancel, ""}, {onAttached, ledger.CancelRequested}, {onEnded, ledger.CancelRequested},
			{onSettle, ledger.Settled}}},
		{"cancel while detached", []step{{onLaunched, ledger.Running}, {onLost, ledger.Detached},
			{onCancel, ledger.CancelRequested}, {onLost, ledger.Detached}, {onAttached, ledger.CancelRequested}}},
		{"cancel before the launch", []step{{onCancel, ledger.CancelRequested}, {onLost, ledger.CancelRequested},
			{onAttached, ""}, {onSettle, ledger.Settled}, {onCancel, ""}, {onLaunched, ""}}},
		{"cancel before the launch, which reached the host", []step{{onCancel, ledger.CancelRequested},
			{onLaunched, ledger.CancelRequested}, {onLost, ledger.Detached}, {onAttached, ledger.CancelRequested}}},
		{"cancelled launch, host not answering", []step{{onCancel, ledger.CancelRequested}, {onGiveUp, ledger.Launching}}},
		{"give-up while detached", []step{{onLaunched, ledger.Running}, {onLost, ledger.Detached}, {onGiveUp, ledger.Detached}}},
		{"give-up before the launch", []step{{onLost, ledger.Launching}, {onGiveUp, ledger.Launching}}},
		{"give-up while settling", []step{{onLaunched, ledger.Running}, {onEnded, ledger.Running}, {onLost, ""},
			{onGiveUp, ledger.Detached}}},
		{"live again", []step{{onLaunched, ledger.Running}, {onEnded, ledger.Running}, {onEnded, ""},
			{onLive, ledger.Running}, {onLive, ""}, {onEnded, ledger.Running}, {onSettle, ledger.Settled}}},
		{"cancel while settling", []step{{onLaunched, ledger.Running}, {onEnded, ledger.Running},
			{onCancel, ledger.CancelRequested}, {onLive, ledger.CancelRequested}, {onEnded, ledger.CancelRequested},
			{onSettle, ledger.Settled}}},
		{"launch failed", []step{{onEnded, ledger.Launching}, {onLaunched, ""}, {onLive, ""}, {onSettle, ledger.Settled}}},
		{"launched once", []step{{onLaunched, ledger.Running}, {onLaunched, ""}}},
		{"settled is final", []step{{onLaunched, ledger.Running}, {onEnded, ledger.Running}, {onSettle, ledger.Settled},
			{onCancel, ""}, {onLost, ""}, {onGiveUp, ""}, {onEnded, ""}, {onSettle, ""}}},
		{"a launched run is not settled unlearned", []step{{onLaunched, ledger.Running}, {onSettle, ""},
			{onLost, ledger.Detached}, {onSettle, ""}}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			s := runState{}
			if s.ledgerState() != ledger.Launching {
				t.Fatalf("a new run is %q, want launching", s.ledgerState())
			}
			for i, st := range p.steps {
				got, err := s.next(st.e)
				if st.ledger == "" {
					if err == nil || got != s {
						t.Fatalf("step %d: %v on %v = %v, %v; want refused", i, s, st.e, got, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v on %v refused: %v", i, s, st.e, err)
				}
				s = got
				if s.ledgerState() != st.ledger {
					t.Fatalf("step %d (%v): ledger %q, want %q", i, st.e, s.ledgerState(), st.ledger)
				}
			}
		})
	}
}

// TestRunStateRecorded: only the moves in and out of settling are the
// controller's own; every other transition is written to the ledger.
func TestRunStateRecorded(t *testing.T) {
	for _, e := range everyRunEvents {
		want := e != onEnded && e != onLive
		if e.recorded() != want {
			t.Errorf("%v recorded = %t, want %t", e, e.recorded(), want)
		}
	}
}

func TestRunStateNames(t *testing.T) {
	for p, want := range map[phase]string{phaseLaunching: "launching", phaseRunning: "running", phaseDetached: "detached",
		phaseCancelRequested: "cancel_requested", phaseSettling: "settling", phaseSettled: "settled", phase(9): "phase(9)"} {
		if p.String() != want {
			t.Errorf("phase %d = %q, want %q", int(p), p, want)
		}
	}
	if got := runEvent(42).String(); got != "event(42)" {
		t.Errorf("runEvent(42) = %q", got)
	}
	_, err := stSettled.next(onCancel)
	if want := "controller: cancel is not a transition from settled (launched true, cancel false)"; err == nil || err.Error() != want {
		t.Errorf("refusal = %v, want %q", err, want)
	}
}
