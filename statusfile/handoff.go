package statusfile

// Handoff is a run that a job of this run started on another host with
// `agent-wrap ssh` and registered with this run's wrapper (see package
// handoff): the outer run bounds it, stops it before its own group, and
// reports how it ended.
type Handoff struct {
	// RunID and Dest are the inner run and where it runs.
	RunID string `json:"run_id"`
	Dest  string `json:"dest"`
	// ControllerPID and ControllerStart are the inner controller, a
	// process of this run (verified at registration).
	ControllerPID   int    `json:"controller_pid"`
	ControllerStart uint64 `json:"controller_start"`
	RegisteredAt    string `json:"registered_at"`
	// Outcome is HandoffRunning until the end is known, then the inner
	// controller's settled outcome (completed, cancelled, not_started) or
	// HandoffUnknown.
	Outcome  string `json:"outcome"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Cause    string `json:"cause,omitempty"`
	// Learned says how the outcome was learned: HandoffByController (the
	// inner controller reported it), HandoffUnconfirmed (no confirmation
	// within the handoff grace) or HandoffConnectionClosed (the controller
	// went away without a word).
	Learned string `json:"learned,omitempty"`
	// LeaseEndsAt is when the inner run's lease ends at the latest (RFC
	// 3339), as last reported; empty before the launch was seen.
	LeaseEndsAt string `json:"lease_ends_at,omitempty"`
	// Remaining, for an unknown outcome, names who owns the rest of the
	// work: the inner run's lease on its host, and settle.
	Remaining string `json:"remaining,omitempty"`
	EndedAt   string `json:"ended_at,omitempty"`
}

// Handoff outcomes the wrapper itself gives; the others are the inner
// controller's.
const (
	HandoffRunning = "running"
	HandoffUnknown = "unknown"
)

// How a handoff's outcome was learned.
const (
	HandoffByController     = "controller"
	HandoffUnconfirmed      = "unconfirmed"
	HandoffConnectionClosed = "connection_closed"
)

// RemainingWork names the owner of the rest of a handoff whose end is not
// confirmed: the inner run's lease on its host, and settle.
func (h Handoff) RemainingWork() string {
	ends := "its lease end is not known (the launch was not seen)"
	if h.LeaseEndsAt != "" {
		ends = "lease ends at " + h.LeaseEndsAt
	}
	return "run " + h.RunID + " on " + h.Dest + ", " + ends + ", settle with 'agent-wrap settle " + h.RunID + "'"
}
