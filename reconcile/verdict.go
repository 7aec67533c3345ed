// Package reconcile is the verdict on a run: what happened to it, judged
// from its record and from what the host shows now, never from hope.
//
// Decide is a pure function of the evidence (the record or why it could not
// be read, whether the wrapper is alive, the validated live members of the
// run's process group, whether the host rebooted, the deadline). Gather
// collects that evidence on Linux, reading only: it never signals and never
// writes. The rules are the contract's reconcile table; README.md in this
// directory lists them with the choices made where the contract is silent.
//
// "unknown" is an answer. A wrong "completed" or "cancelled" is an incident,
// so every rule that cannot confirm the outcome says unknown and why.
package reconcile

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Outcomes.
const (
	Completed = "completed" // the record is finished (or launch_failed): exit_code is the run's
	Cancelled = "cancelled" // the record is cancelled and nothing of the run is alive
	Running   = "running"   // the run is live: its wrapper, or members of its group, run
	Unknown   = "unknown"   // the outcome cannot be confirmed; reason says why
)

// Supervisor values: the wrapper is alive, it is gone while the run is not
// terminal (supervision lost), or there is none to speak of (the run is
// over, or the record does not say who supervised it).
const (
	SupervisorAlive = "alive"
	SupervisorLost  = "lost"
	SupervisorNone  = "none"
)

// Member is a validated live process of the run: a member of its process
// group (recorded PGID and SID, started no earlier than the leader, not a
// zombie) or a recorded escaped descendant with its recorded start time.
type Member struct {
	PID     int    `json:"pid"`
	PGID    int    `json:"pgid"`
	SID     int    `json:"sid"`
	State   string `json:"state"` // the /proc state letter: R, S, D, T, ...
	Comm    string `json:"comm"`
	Escaped bool   `json:"escaped,omitempty"`
}

// Input is the evidence a verdict is decided on.
type Input struct {
	RunID string
	// Record is the parsed status.json; nil when RecordErr says why not.
	Record    *statusfile.Record
	RecordErr error
	// WrapperAlive: the recorded wrapper PID runs, with the recorded start
	// time, in this boot, and is not a zombie.
	WrapperAlive bool
	// BootChanged: the record's boot_id is not this boot's.
	BootChanged bool
	// Members are the validated live processes of the run (see Member).
	// They are not looked for when the boot changed.
	Members []Member
	// MembersErr is why the members could not be determined (an
	// inconsistent record, /proc unreadable); nil when they were.
	MembersErr error
	// Rejected are processes in the recorded group number that failed
	// validation and so are not the run's (a reused PID, say).
	Rejected []string
	// Deadline is the lease deadline in Unix seconds; 0 when the run has
	// no lease or it could not be read (DeadlineErr).
	Deadline    int64
	DeadlineErr error
	// LockBusy: another agent-wrap process (cancel, watchdog, the wrapper)
	// held the run's lock for the whole time evidence was gathered, so a
	// state transition may have been under way.
	LockBusy bool
	// Now is when the evidence was gathered.
	Now time.Time
}

// Evidence is what a verdict shows of its input, as printed by --json.
type Evidence struct {
	State          string   `json:"state"` // "" when the record is unreadable
	Cause          string   `json:"cause,omitempty"`
	ExitCode       *int     `json:"exit_code,omitempty"` // the recorded exit_code of a terminal record
	RecordError    string   `json:"record_error,omitempty"`
	Boundary       string   `json:"boundary,omitempty"` // what contains the run: cgroup or session+subreaper
	WrapperPID     int      `json:"wrapper_pid,omitempty"`
	WrapperAlive   bool     `json:"wrapper_alive"`
	Members        []Member `json:"members"`
	MembersError   string   `json:"members_error,omitempty"`
	Rejected       []string `json:"rejected,omitempty"`
	Survivors      []int    `json:"survivors,omitempty"`   // recorded survivors of the final KILL
	Containment    string   `json:"containment,omitempty"` // what the final record vouches for: cgroup, subreaper or session
	BootChanged    bool     `json:"boot_changed"`
	Deadline       *int64   `json:"deadline"` // Unix seconds; null: no lease
	DeadlinePassed bool     `json:"deadline_passed"`
	DeadlineError  string   `json:"deadline_error,omitempty"`
	LockBusy       bool     `json:"lock_busy,omitempty"`
}

// Verdict is the answer for one run.
type Verdict struct {
	RunID      string   `json:"run_id"`
	Outcome    string   `json:"outcome"`
	ExitCode   *int     `json:"exit_code"` // the run's code when completed or cancelled; null otherwise
	Reason     string   `json:"reason"`
	Supervisor string   `json:"supervisor"`
	Evidence   Evidence `json:"evidence"`
	// Handoffs are the runs the job started on other hosts, as the record
	// names them (handoffs.go).
	Handoffs []statusfile.Handoff `json:"handoffs,omitempty"`
}

// Exit codes of the reconcile command for one verdict.
const (
	exitDecided = exitcode.OK // completed or cancelled
	exitRunning = exitcode.Running
	exitUnknown = exitcode.Unknown
)

// OutcomeExit maps an outcome to reconcile's exit code.
func OutcomeExit(outcome string) int {
	switch outcome {
	case Completed, Cancelled:
		return exitDecided
	case Running:
		return exitRunning
	}
	return exitUnknown
}

// Worst combines exit codes of several verdicts: unknown (4) wins over
// running (3), which wins over decided (0). Unknown wins because it needs a
// person or a cancel, while running only needs patience; a controller that
// polls "until the exit is not 3" stops on it either way.
func Worst(a, b int) int {
	rank := func(c int) int {
		switch c {
		case exitUnknown:
			return 2
		case exitRunning:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// Decide applies the reconcile rules to the evidence. It is pure: the same
// input always gives the same verdict.
func Decide(in Input) Verdict {
	return withHandoffs(decide(in), in.Record)
}

func decide(in Input) Verdict {
	v := Verdict{RunID: in.RunID, Supervisor: SupervisorNone, Evidence: evidence(in)}
	rec := in.Record
	if rec == nil {
		err := in.RecordErr
		if err == nil {
			err = errors.New("no record")
		}
		v.Outcome = Unknown
		v.Reason = "the run's record cannot be read: " + err.Error()
		return v
	}
	if in.WrapperAlive {
		v.Supervisor = SupervisorAlive
	} else if !statusfile.Terminal(rec.State) {
		v.Supervisor = SupervisorLost
	}

	switch rec.State {
	case statusfile.Finished, statusfile.LaunchFailed:
		v.Outcome = Completed
		v.ExitCode = intp(rec.Code())
		if rec.State == statusfile.LaunchFailed {
			v.Reason = fmt.Sprintf("launch failed with exit code %d: %s", rec.Code(), orNone(rec.Error))
		} else {
			v.Reason = "the job finished with exit code " + strconv.Itoa(rec.Code())
			if rec.Signal != "" {
				v.Reason += " (its leader was killed by SIG" + rec.Signal + ")"
			}
		}
		// The record decides; stragglers that outlived the wrapper's stop
		// are worth saying, not worth a different outcome.
		if len(in.Members) > 0 && !in.BootChanged {
			v.Reason += "; note: processes of the run are still alive: " + describeMembers(in.Members)
		} else if rec.SurvivorsUnknown() {
			v.Reason += "; note: whether processes of it outlived it cannot be known: " + escapesUnseen
		}
		return v

	case statusfile.Cancelled:
		switch {
		case in.BootChanged:
			// A reboot ended every process of the earlier boot.
			v.Outcome = Cancelled
			v.ExitCode = intp(rec.Code())
			v.Reason = fmt.Sprintf("cancelled (cause %s); the host has rebooted since, so nothing of it runs", orNone(rec.Cause))
		case in.MembersErr != nil:
			v.Outcome = Unknown
			v.Reason = fmt.Sprintf("recorded cancelled (cause %s) but its cleanup cannot be confirmed: %v", orNone(rec.Cause), in.MembersErr)
		case len(in.Members) > 0:
			v.Outcome = Unknown
			v.Reason = fmt.Sprintf("recorded cancelled (cause %s) but cleanup is not confirmed: %s still alive", orNone(rec.Cause), describeMembers(in.Members)+isAre(in.Members))
		case rec.Containment == statusfile.ContainmentSession:
			v.Outcome = Unknown
			v.Reason = fmt.Sprintf("recorded cancelled (cause %s) but its cleanup cannot be confirmed: %s; none of the run's session or recorded escapes is alive", orNone(rec.Cause), escapesUnseen)
		default:
			v.Outcome = Cancelled
			v.ExitCode = intp(rec.Code())
			v.Reason = fmt.Sprintf("cancelled (cause %s, exit code %d); no process of the run is alive", orNone(rec.Cause), rec.Code())
		}
		return v
	}

	// Not terminal: starting, running or cancelling.
	what := describeState(rec)
	switch {
	case in.BootChanged:
		v.Outcome = Unknown
		v.Reason = fmt.Sprintf("host rebooted since the run started (recorded boot_id %s); it was %s and has no final record", rec.BootID, what)
	case in.WrapperAlive:
		v.Outcome = Running
		v.Reason = fmt.Sprintf("its wrapper (PID %d) is alive; the run is %s", rec.WrapperPID, what)
		if rec.State == statusfile.Cancelling {
			v.Reason += " and the wrapper is stopping it"
		}
		v.Reason += leaseNote(in, rec)
	case in.MembersErr != nil:
		v.Outcome = Unknown
		v.Reason = fmt.Sprintf("its wrapper (PID %d) is gone and the run's processes cannot be checked: %v; it was %s", rec.WrapperPID, in.MembersErr, what)
	case len(in.Members) > 0:
		v.Outcome = Running
		v.Reason = fmt.Sprintf("supervisor lost: its wrapper (PID %d) is gone but %s still alive; it was %s", rec.WrapperPID, describeMembers(in.Members)+isAre(in.Members), what)
		v.Reason += leaseNote(in, rec)
		v.Reason += "; 'agent-wrap cancel' stops it"
	default:
		v.Outcome = Unknown
		v.Reason = fmt.Sprintf("supervisor died before a final record: its wrapper (PID %d) is gone and no process of the run is alive; it was %s", rec.WrapperPID, what)
		if rec.JobUnrecorded() {
			v.Reason += "; it never recorded a process group, so a job may have started unseen"
		}
		if in.LockBusy {
			v.Reason += "; another agent-wrap process holds the run's lock, so a final record may be on its way: ask again"
		}
	}
	return v
}

// escapesUnseen is why a record under containment session proves nothing
// about escapes.
const escapesUnseen = "it had no cgroup and was not ended by its wrapper (containment session), so a process that left its session unrecorded cannot be seen"

func evidence(in Input) Evidence {
	ev := Evidence{
		WrapperAlive: in.WrapperAlive,
		Members:      in.Members,
		Rejected:     in.Rejected,
		BootChanged:  in.BootChanged,
		LockBusy:     in.LockBusy,
	}
	if ev.Members == nil {
		ev.Members = []Member{}
	}
	if in.RecordErr != nil {
		ev.RecordError = in.RecordErr.Error()
	}
	if in.MembersErr != nil {
		ev.MembersError = in.MembersErr.Error()
	}
	if rec := in.Record; rec != nil {
		ev.State, ev.Cause, ev.WrapperPID, ev.Boundary = rec.State, rec.Cause, rec.WrapperPID, rec.Boundary
		if statusfile.Terminal(rec.State) {
			ev.ExitCode = intp(rec.Code())
		}
		if len(rec.Survivors) > 0 {
			ev.Survivors = rec.Survivors
		}
		ev.Containment = rec.Containment
	}
	if in.Deadline > 0 {
		dl := in.Deadline
		ev.Deadline = &dl
		ev.DeadlinePassed = !in.Now.Before(time.Unix(dl, 0))
	}
	if in.DeadlineErr != nil {
		ev.DeadlineError = in.DeadlineErr.Error()
	}
	return ev
}

// describeState says what the record shows: "running", "cancelling (cause
// lease)", "starting".
func describeState(rec *statusfile.Record) string {
	switch rec.State {
	case statusfile.Cancelling:
		return "cancelling (cause " + orNone(rec.Cause) + ")"
	case statusfile.Starting:
		return "starting, not cancelling"
	}
	return rec.State + ", not cancelling"
}

// leaseNote tells about a lease that has passed while the run is live.
func leaseNote(in Input, rec *statusfile.Record) string {
	if in.Deadline <= 0 || in.Now.Before(time.Unix(in.Deadline, 0)) || rec.State == statusfile.Cancelling {
		return ""
	}
	late := in.Now.Sub(time.Unix(in.Deadline, 0)).Truncate(time.Second)
	return fmt.Sprintf("; its lease expired %v ago", late)
}

// describeMembers names the processes: "PID 123 (sleep)" or "PIDs 1, 2
// (sleep, sh)".
func describeMembers(ms []Member) string {
	pids := make([]string, 0, len(ms))
	comms := make([]string, 0, len(ms))
	for _, m := range ms {
		p := strconv.Itoa(m.PID)
		if m.Escaped {
			p += " (escaped)"
		}
		pids = append(pids, p)
		comms = append(comms, m.Comm)
	}
	if len(ms) == 1 {
		return fmt.Sprintf("PID %s (%s)", pids[0], comms[0])
	}
	return fmt.Sprintf("PIDs %s (%s)", strings.Join(pids, ", "), strings.Join(comms, ", "))
}

func isAre(ms []Member) string {
	if len(ms) == 1 {
		return " is"
	}
	return " are"
}

func orNone(s string) string {
	if s == "" {
		return "none recorded"
	}
	return s
}

func intp(v int) *int { return &v }
