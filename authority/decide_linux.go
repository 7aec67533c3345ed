// Package authority answers one question for every gateway on a host (the
// run's own SSH agent relay, `agent-wrap authorize` for a credential helper,
// a token broker, a proxy): may this process act now, on behalf of this
// run? and it journals each answer as an `action` event.
//
// Guarantees of Gate.Decide:
//   - The answer is decided and journaled under the run's lock, the lock
//     under which the wrapper, cancel and the watchdog record an intent
//     (cancel_requested, deadline_expired) and renew moves the deadline. So
//     the journal orders every decision against every intent, and an
//     `accepted` is never journaled after an intent: it needs the record
//     `running` (an intent writes `cancelling` under the same lock) and the
//     deadline in the future.
//   - An accepted answer is synced to disk before Decide returns, so no
//     caller acts on an answer the journal could lose. An answer that
//     cannot be journaled is a refusal.
//   - Nothing secret is journaled: a channel, a request name, a key's
//     SHA-256 fingerprint, a target text the gateway chose, the caller's
//     PID and start time, the decision and its reason.
//
// Not guaranteed: what the caller does with an accepted answer afterwards.
// A token handed out while the run was live stays in the caller's memory;
// the journal says when it was handed out.
package authority

import (
	"errors"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Decisions.
const (
	Accepted = "accepted"
	Refused  = "refused"
)

// Reasons Decide gives. A gateway may refuse for its own reasons as well
// (Action.Refusal).
const (
	ReasonRunning    = "running"           // accepted
	ReasonNotRunning = "not_running"       // starting, or terminal
	ReasonIntent     = "intent_recorded"   // cancelling: cancel_requested or deadline_expired is on record
	ReasonLease      = "lease_expired"     // the deadline has passed
	ReasonNotMember  = "not_in_run"        // the caller is not one of the run's processes
	ReasonNoRecord   = "record_unreadable" // status.json cannot be read
	ReasonNoJournal  = "journal_failed"    // the answer could not be journaled
)

// Reasons every gateway (the agent relay, the HTTP gateway) gives for
// refusing a caller before it asks, with the same meaning: the process at
// the other end of the connection, as read at accept, is not one that
// could act for the run. A gateway's refusals about the request itself
// are its own.
const (
	ReasonCallerGone = "caller_gone" // the connecting process has exited, or its PID is another process's now
	ReasonOtherUser  = "other_user"  // the connecting process is another user's
)

// ChannelSSHAgent is the channel of the run's own agent relay.
const ChannelSSHAgent = "ssh-agent"

// EventAction is the journal event of one answer.
const EventAction = "action"

// Action is one request for authority.
type Action struct {
	// Channel is the gateway: ChannelSSHAgent, or the name a gateway gave.
	Channel string
	// Request names what is asked (the agent's identities, sign,
	// session-bind or message number); empty for authorize.
	Request string
	// Key is the SHA-256 fingerprint of the key a signature is asked of.
	Key string
	// Target is what the gateway says the action is for (a host, a URL).
	Target string
	// CallerPID and CallerStart identify the process that asks.
	CallerPID   int
	CallerStart uint64
	// Refusal, if set, is a refusal the gateway has already decided; it is
	// journaled as the reason.
	Refusal string
}

// Decision is Decide's answer, as `authorize` prints it.
type Decision struct {
	RunID         string `json:"run_id"`
	Decision      string `json:"decision"`
	Reason        string `json:"reason"`
	DeadlineEpoch int64  `json:"deadline_epoch,omitempty"`
	Seq           int64  `json:"seq,omitempty"`
}

// Allowed reports whether the decision is accepted.
func (d Decision) Allowed() bool { return d.Decision == Accepted }

// Member reports whether the process pid with start time start is one of
// the processes of the run whose record is rec.
type Member func(rec *statusfile.Record, pid int, start uint64) bool

// Gate is where one run's requests are decided.
type Gate struct {
	// Dir is the run's directory.
	Dir *rundir.Dir
	// Member judges the caller: membership.Found.Holds for a gateway
	// outside the wrapper (authorize), the wrapper's own view inside it.
	Member Member
	// Append journals an event; nil appends through a descriptor opened
	// for the line (journal.Append). The wrapper passes its own journal.
	Append func(event string, f journal.Fields, sync bool) (int64, error)
}

// Decide answers a under the run's lock and journals the answer (synced
// when accepted). The error is non-nil when the answer could not be
// journaled (the decision is then a refusal) or the lock not taken.
func (g Gate) Decide(a Action) (Decision, error) {
	d := g.Dir
	unlock, err := d.Lock()
	if err != nil {
		return Decision{RunID: d.ID, Decision: Refused, Reason: ReasonNoJournal}, err
	}
	defer unlock()
	rec, err := statusfile.Read(d)
	return g.decide(a, rec, err)
}

// decide is Decide once the lock is held and the record read under it (err:
// the read's error).
func (g Gate) decide(a Action, rec *statusfile.Record, err error) (Decision, error) {
	d, member := g.Dir, g.Member
	appendEvent := g.Append
	if appendEvent == nil {
		appendEvent = func(event string, f journal.Fields, sync bool) (int64, error) {
			return journal.Append(d, event, f, sync)
		}
	}
	dec := Decision{RunID: d.ID, Decision: Refused}
	// The journal's deadline (lease.Effective): a deadline_epoch written
	// later by hand revives no authority.
	deadline, _, derr := lease.Effective(d)
	if derr == nil {
		dec.DeadlineEpoch = deadline
	}
	switch {
	case a.Refusal != "":
		dec.Reason = a.Refusal
	case err != nil:
		dec.Reason = ReasonNoRecord
	case rec.State == statusfile.Cancelling:
		dec.Reason = ReasonIntent
	case rec.State != statusfile.Running:
		dec.Reason = ReasonNotRunning
	case derr != nil && !errors.Is(derr, lease.ErrNoDeadline):
		dec.Reason = ReasonLease // a deadline that cannot be read is not in the future
	case derr == nil && !time.Now().Before(time.Unix(deadline, 0)):
		dec.Reason = ReasonLease
	case !member(rec, a.CallerPID, a.CallerStart):
		dec.Reason = ReasonNotMember
	default:
		dec.Decision, dec.Reason = Accepted, ReasonRunning
	}

	f := journal.Fields{"channel": a.Channel, "caller_pid": a.CallerPID, "caller_start": a.CallerStart,
		"decision": dec.Decision, "reason": dec.Reason}
	if a.Request != "" {
		f["request"] = a.Request
	}
	if a.Key != "" {
		f["key"] = a.Key
	}
	if a.Target != "" {
		f["target"] = a.Target
	}
	seq, jerr := appendEvent(EventAction, f, dec.Allowed())
	if jerr != nil {
		dec.Decision, dec.Reason, dec.Seq = Refused, ReasonNoJournal, 0
		return dec, fmt.Errorf("run %s: %w", d.ID, jerr)
	}
	dec.Seq = seq
	return dec, nil
}
