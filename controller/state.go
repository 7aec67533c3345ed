package controller

import (
	"fmt"

	"github.com/agent-wrap/agent-wrap/ledger"
)

// A run's state as its controller drives it, and the one rule for how it
// moves (runState.next). Run holds one runState under its lock and moves
// it with Run.move, which writes the ledger record with the state's
// ledger name in the same step; the launched and cancel channels are only
// wake-ups, closed once their transition is written.

// phase is where a run stands.
type phase int

const (
	// phaseLaunching: no launch has been seen to reach the host (the
	// ledger's launching). A lost attempt stays here: nothing was seen to
	// start, and it is retried.
	phaseLaunching phase = iota
	// phaseRunning: the host has the run and a connection follows it.
	phaseRunning
	// phaseDetached: the host has the run and no connection follows it
	// (lost, or left to settle after --give-up); Follow reattaches.
	phaseDetached
	// phaseCancelRequested: a cancel was asked for, and the run is
	// neither detached nor ending. Whether it had been launched is the
	// state's launched.
	phaseCancelRequested
	// phaseSettling: the attach or the launch ended and the outcome is
	// being learned (the cancel's confirmation, the host's verdict). The
	// controller's own: the ledger keeps the state it had (see
	// ledgerState).
	phaseSettling
	// phaseSettled: the outcome is recorded. Nothing moves it again.
	phaseSettled
)

var phaseNames = [...]string{"launching", "running", "detached", "cancel_requested", "settling", "settled"}

func (p phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("phase(%d)", int(p))
	}
	return phaseNames[p]
}

// runEvent is what happens to a run.
type runEvent int

const (
	// onLaunched: the run's record arrived from the host, or a verdict
	// says the host has the run (a launch whose answer was lost).
	onLaunched runEvent = iota
	// onLost: a launch attempt or an attach lost its connection.
	onLost
	// onAttached: a reattach is up (its first byte, a renewal while it
	// ran, or its end with the run's code).
	onAttached
	// onCancel: Cancel was called.
	onCancel
	// onEnded: the attach (or a launch without a record) ended with a
	// code: the outcome is to be learned.
	onEnded
	// onLive: the outcome's learning found the run live: follow it again.
	onLive
	// onGiveUp: the controller leaves the run unsettled for settle
	// (--give-up passed, or a cancelled launch's host could not be asked).
	onGiveUp
	// onSettle: the outcome is recorded.
	onSettle
)

var eventNames = [...]string{"launched", "lost", "attached", "cancel", "ended", "live", "give_up", "settle"}

func (e runEvent) String() string {
	if e < 0 || int(e) >= len(eventNames) {
		return fmt.Sprintf("event(%d)", int(e))
	}
	return eventNames[e]
}

// recorded reports whether the event's transition is written to the
// ledger. onEnded and onLive move only between the controller's own
// settling and the state it came from, which the ledger keeps.
func (e runEvent) recorded() bool { return e != onEnded && e != onLive }

// runState is a run's phase with the two facts that outlast a phase:
// whether the host has the run, and whether a cancel was asked for (a
// reattach after a loss returns to cancel_requested, not running; a
// give-up leaves a launched run detached, one never seen to start
// launching).
type runState struct {
	phase    phase
	launched bool // the host has the run: its record arrived, or a verdict said so
	cancel   bool // a cancel was asked for; it stays asked
}

func (s runState) String() string {
	return fmt.Sprintf("%s (launched %t, cancel %t)", s.phase, s.launched, s.cancel)
}

// errRefused is next's answer to an event the state does not allow.
type errRefused struct {
	from runState
	e    runEvent
}

func (err *errRefused) Error() string {
	return fmt.Sprintf("controller: %s is not a transition from %s", err.e, err.from)
}

// next is the transition function: the state after e, or an *errRefused
// (and s unchanged) when e cannot happen in s.
func (s runState) next(e runEvent) (runState, error) {
	refused := func() (runState, error) { return s, &errRefused{from: s, e: e} }
	if s.phase == phaseSettled {
		return refused() // settled is final: a late Cancel, say, does nothing
	}
	t := s
	switch e {
	case onLaunched:
		// Once, and only while the launch is what is being driven: a
		// cancel asked for meanwhile stays asked (cancelLoop sends it
		// once the run is launched).
		if s.launched || (s.phase != phaseLaunching && s.phase != phaseCancelRequested) {
			return refused()
		}
		t.phase, t.launched = phaseRunning, true
		if s.cancel {
			t.phase = phaseCancelRequested
		}
	case onLost:
		switch s.phase {
		case phaseLaunching, phaseCancelRequested:
			if !s.launched {
				break // nothing was seen to start: the launch is retried (or the cancel answered)
			}
			t.phase = phaseDetached
		case phaseRunning, phaseDetached:
			t.phase = phaseDetached
		default:
			return refused() // settling asks the host, and retries, on its own connections
		}
	case onAttached:
		switch {
		case !s.launched:
			return refused()
		case s.phase == phaseDetached && s.cancel:
			t.phase = phaseCancelRequested
		case s.phase == phaseDetached:
			t.phase = phaseRunning
		case s.phase == phaseCancelRequested:
			// The cancel came while detached: the reattach is up, the
			// cancel still asked.
		default:
			return refused()
		}
	case onCancel:
		if s.cancel {
			return refused() // once
		}
		t.cancel = true
		if s.phase != phaseSettling {
			t.phase = phaseCancelRequested
		}
	case onEnded:
		if s.phase == phaseSettling {
			return refused()
		}
		t.phase = phaseSettling
	case onLive:
		if s.phase != phaseSettling || !s.launched {
			return refused()
		}
		t.phase = phaseRunning
		if s.cancel {
			t.phase = phaseCancelRequested
		}
	case onGiveUp:
		t.phase = phaseDetached
		if !s.launched {
			t.phase = phaseLaunching // never seen to start: settle may find it not started
		}
	case onSettle:
		// A launched run's outcome is learned (settling) before it is
		// recorded; one never launched may be settled at once (it could
		// not connect, it was cancelled before the launch, the outer run
		// refused it).
		if s.phase != phaseSettling && s.launched {
			return refused()
		}
		t.phase = phaseSettled
	default:
		return refused()
	}
	return t, nil
}

// ledgerState is the state's name in the ledger (ledger.Launching, ...).
// Settling has none of its own: it is written only when a cancel comes
// while the outcome is learned (cancel_requested), and otherwise names the
// state the run ended from.
func (s runState) ledgerState() string {
	switch s.phase {
	case phaseLaunching:
		return ledger.Launching
	case phaseRunning:
		return ledger.Running
	case phaseDetached:
		return ledger.Detached
	case phaseCancelRequested:
		return ledger.CancelRequested
	case phaseSettled:
		return ledger.Settled
	}
	switch {
	case s.cancel:
		return ledger.CancelRequested
	case s.launched:
		return ledger.Running
	}
	return ledger.Launching
}
