// Package statusfile is a run's record, status.json: its schema, the states
// and causes, and its atomic replacement.
//
// Guarantees: Write replaces the file atomically (a temp file in the run
// directory, fsynced, renamed), so a reader sees the previous record
// or the new one, never a torn one; with durable set the directory is fsynced
// as well, so the record survives a crash of the host. The exception is a
// full file system, where the record is overwritten in place so that it
// lands at all (a reader may then meet a torn one). Parse rejects anything
// that is not a complete schema-1 record, so a half-written or foreign file
// is an error, never a record; ReadOrRebuild (Linux) then rebuilds the
// record from the run's journal and pid files, for those who must act on
// it.
package statusfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Schema is the version of the record format.
const Schema = 1

// States of a run. Terminal states are Finished, Cancelled and LaunchFailed;
// nothing ever leaves one.
const (
	Starting     = "starting"
	Running      = "running"
	Cancelling   = "cancelling"
	Finished     = "finished"
	Cancelled    = "cancelled"
	LaunchFailed = "launch_failed"
)

// Causes: why a run is stopping or stopped.
const (
	CauseTERM   = "signal:TERM"
	CauseINT    = "signal:INT"
	CauseHUP    = "signal:HUP"
	CauseCancel = "cancel"
	CauseLease  = "lease"
	// CauseStdinLost: the job's stdin stream could not be resumed after a
	// lost connection without a hole in it (run --stdin pipe).
	CauseStdinLost = "stdin_lost"
)

// Containment: what a run's final record can vouch for, written with it
// (`containment`). A stop writes `nothing survived` (an empty survivors
// list) only under ContainmentCgroup or ContainmentSubreaper, each the
// proof named; under ContainmentSession no such proof was had, and an
// empty list is written as null: unknown.
const (
	// ContainmentCgroup: the run's cgroup was seen unpopulated at the end.
	ContainmentCgroup = "cgroup"
	// ContainmentSubreaper: the wrapper, the subreaper of every process
	// the job made, was left with no child (wait4 said ECHILD).
	ContainmentSubreaper = "subreaper"
	// ContainmentSession: only the job's session and the escapes the
	// wrapper recorded could be looked at (a stop from outside the wrapper
	// without a cgroup, or a proof that did not hold): a process that left
	// the session unrecorded cannot be seen.
	ContainmentSession = "session"
)

// Exit codes a run returns for its causes.
const (
	ExitLease = exitcode.Lease
)

// CauseExitCode is the code `run` and `wait` return for a run cancelled with
// cause c: 143/130/129 for TERM/INT/HUP, 143 for cancel, 124 for lease.
func CauseExitCode(c string) int {
	switch c {
	case CauseTERM, CauseCancel, CauseStdinLost:
		return exitcode.TERM
	case CauseINT:
		return exitcode.INT
	case CauseHUP:
		return exitcode.HUP
	case CauseLease:
		return ExitLease
	}
	return exitcode.Failure
}

// Terminal reports whether state is terminal.
func Terminal(state string) bool {
	return state == Finished || state == Cancelled || state == LaunchFailed
}

var validStates = map[string]bool{Starting: true, Running: true, Cancelling: true, Finished: true, Cancelled: true, LaunchFailed: true}

// Escaped is a descendant of the job that left its process group or
// session, recorded so cancel and watchdog can find and validate it after
// the wrapper died.
type Escaped struct {
	PID   int      `json:"pid"`
	PGID  int      `json:"pgid"`
	SID   int      `json:"sid"`
	Start uint64   `json:"start"`
	Argv  []string `json:"argv,omitempty"`
}

// Record is the content of status.json.
type Record struct {
	Schema       int       `json:"schema"`
	RunID        string    `json:"run_id"`
	State        string    `json:"state"`
	Cause        string    `json:"cause,omitempty"`
	ExitCode     *int      `json:"exit_code,omitempty"`
	Signal       string    `json:"signal,omitempty"`
	Error        string    `json:"error,omitempty"`
	PID          int       `json:"pid,omitempty"`
	PGID         int       `json:"pgid,omitempty"`
	SID          int       `json:"sid,omitempty"`
	WrapperPID   int       `json:"wrapper_pid"`
	LeaderStart  uint64    `json:"leader_start,omitempty"`
	WrapperStart uint64    `json:"wrapper_start"`
	BootID       string    `json:"boot_id"`
	Command      []string  `json:"command"`
	CreatedAt    string    `json:"created_at"`
	StartedAt    string    `json:"started_at,omitempty"`
	EndedAt      string    `json:"ended_at,omitempty"`
	LeaseSeconds float64   `json:"lease_seconds"`
	GraceSeconds float64   `json:"grace_seconds"`
	OnHangup     string    `json:"on_hangup,omitempty"`
	Boundary     string    `json:"boundary,omitempty"`
	Cgroup       string    `json:"cgroup,omitempty"`
	Escaped      []Escaped `json:"escaped,omitempty"`
	Containment  string    `json:"containment,omitempty"` // a final record's proof (ContainmentCgroup...); "" while live
	Survivors    []int     `json:"survivors"`
	// AgentSocket is the run's scoped SSH agent socket (the job's
	// SSH_AUTH_SOCK), while and after it existed.
	AgentSocket string `json:"agent_socket,omitempty"`
	// ControlSocket is where the wrapper takes handoff registrations (the
	// job's AGENT_WRAP_CONTROL); Handoffs are the runs registered there.
	ControlSocket       string    `json:"control_socket,omitempty"`
	HandoffGraceSeconds float64   `json:"handoff_grace_seconds,omitempty"`
	Handoffs            []Handoff `json:"handoffs,omitempty"`
	// HTTP are the run's credential gateways, by NAME, while and after
	// they existed.
	HTTP map[string]HTTPGateway `json:"http,omitempty"`
	// JournalSeq and JournalHash mark the journal's last line when the
	// record was written (Write sets them), so that verify tells a journal
	// cut at a line boundary from a whole one.
	JournalSeq  int64  `json:"journal_seq,omitempty"`
	JournalHash string `json:"journal_hash,omitempty"`
	// IntentUnrecorded is set when a stop went ahead although its intent
	// could not be journaled (a read-only file system): the lease is the
	// last word, and the record says so.
	IntentUnrecorded bool `json:"intent_unrecorded,omitempty"`
	// Rebuilt is set on a record that ReadOrRebuild made from the run's
	// journal and pid files because status.json was unreadable; once
	// written, the record says so for good.
	Rebuilt bool `json:"rebuilt,omitempty"`
}

// HTTPGateway is one credential gateway of a run, as the job reaches it.
// It holds no secret.
type HTTPGateway struct {
	URL      string   `json:"url"`      // http://127.0.0.1:PORT, the job's AGENT_WRAP_HTTP_<NAME>
	Socket   string   `json:"socket"`   // its unix socket, AGENT_WRAP_HTTP_<NAME>_SOCKET
	Upstream string   `json:"upstream"` // where requests go: scheme, host, prefix
	Methods  []string `json:"methods"`  // forwarded methods; "*" is every one but CONNECT and TRACE
}

// Timestamp formats t as the record's times are: RFC 3339, UTC, nanoseconds.
func Timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Code returns the exit code, or -1 when the record has none.
func (r *Record) Code() int {
	if r.ExitCode == nil {
		return -1
	}
	return *r.ExitCode
}

// SetExit stores the exit code.
func (r *Record) SetExit(code int) { r.ExitCode = &code }

// JobUnrecorded reports whether the record is live but names no job: its
// wrapper had not recorded the job's process group when the record was
// last written. That is a `starting` record, or a `cancelling` one whose
// cancel was recorded while the run was starting (the wrapper keeps the
// cancel when it records the job, so a `cancelling` record without a
// group means it never did). A job may have been started all the same.
func (r *Record) JobUnrecorded() bool {
	return r.PGID <= 1 && (r.State == Starting || r.State == Cancelling)
}

// Marshal renders the record as indented JSON with a trailing newline.
//
// "survivors" is written exactly when the record is terminal, and then as
// a list ([] is the promise that nothing outlived the stop), except that
// none seen under ContainmentSession is null: not a promise, unknown (see
// SurvivorsUnknown). A live run has no survivors to speak of yet.
func Marshal(r *Record) ([]byte, error) {
	type plain Record
	w := struct {
		*plain
		Survivors json.RawMessage `json:"survivors,omitempty"` // shadows Record.Survivors
	}{plain: (*plain)(r)}
	if Terminal(r.State) {
		w.Survivors = json.RawMessage("null")
		if !r.SurvivorsUnknown() {
			s := r.Survivors
			if s == nil {
				s = []int{}
			}
			b, err := json.Marshal(s)
			if err != nil {
				return nil, err
			}
			w.Survivors = b
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(w); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SurvivorsUnknown reports whether the record is terminal but cannot say
// whether anything outlived its stop: none was seen, and the stop had no
// proof beyond the session (ContainmentSession).
func (r *Record) SurvivorsUnknown() bool {
	return Terminal(r.State) && r.Containment == ContainmentSession && len(r.Survivors) == 0
}

// Parse decodes and checks a record. It refuses unknown schemas, unknown
// states, a missing run_id and a terminal record without an exit code.
func Parse(b []byte) (*Record, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, errors.New("status.json is empty")
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("status.json does not parse: %v", err)
	}
	switch {
	case r.Schema != Schema:
		return nil, fmt.Errorf("status.json has schema %d, this agent-wrap reads schema %d", r.Schema, Schema)
	case rundir.ValidID(r.RunID) != nil:
		return nil, fmt.Errorf("status.json has an invalid run_id %q", r.RunID)
	case !validStates[r.State]:
		return nil, fmt.Errorf("status.json has an unknown state %q", r.State)
	case Terminal(r.State) && r.ExitCode == nil:
		return nil, fmt.Errorf("status.json is terminal (%s) but has no exit_code", r.State)
	case r.PID < 0 || r.PGID < 0 || r.SID < 0 || r.WrapperPID < 0:
		return nil, errors.New("status.json has a negative PID")
	}
	// An empty list and no list say the same for the fields Marshal omits
	// when empty ("escaped", "handoffs", an escapee's "argv"); the record keeps the one
	// form Marshal writes, so what is read is what would be written.
	if len(r.Escaped) == 0 {
		r.Escaped = nil
	}
	if len(r.Handoffs) == 0 {
		r.Handoffs = nil
	}
	for i := range r.Escaped {
		if len(r.Escaped[i].Argv) == 0 {
			r.Escaped[i].Argv = nil
		}
	}
	// Survivors exist once the record is terminal (a list, maybe empty,
	// or unknown: nil), never before: the form Marshal writes.
	switch {
	case !Terminal(r.State):
		r.Survivors = nil
	case r.Containment == ContainmentSession && len(r.Survivors) == 0:
		r.Survivors = nil
	case r.Survivors == nil:
		r.Survivors = []int{}
	}
	return &r, nil
}

// Read reads and parses the record of a run.
func Read(d *rundir.Dir) (*Record, error) {
	b, err := d.ReadFile(rundir.StatusFile)
	if err != nil {
		return nil, err
	}
	r, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", d.Path, rundir.StatusFile, err)
	}
	if r.RunID != d.ID {
		return nil, fmt.Errorf("%s/%s: records run %q, not %q", d.Path, rundir.StatusFile, r.RunID, d.ID)
	}
	return r, nil
}

// Write replaces the run's record atomically (the new content is synced
// before the rename, so the file is never empty or torn, even after a power
// loss); durable also fsyncs the directory, so the replacement itself
// survives a power loss. Use durable for terminal records only: only a
// crash of the machine loses an unsynced rename, after the reboot the
// boot_id makes every non-terminal run unknown whether the record says
// starting, running or cancelling, and a terminal record is what still
// answers then.
//
// The record is marked with the journal's last line (journal_seq,
// journal_hash) as it is now. On a full file system the record is
// overwritten in place (see rundir.Dir.WriteAtomic), so the final record
// lands where a rename cannot, if it fits in the blocks the old one has;
// else the write fails and the old record stays whole. A durable write also removes the temp files
// of writers that died before their rename (rundir.Dir.RemoveStaleTemps).
func Write(d *rundir.Dir, r *Record, durable bool) error {
	return WriteMarked(d, r, durable, journal.Tail(d))
}

// WriteMarked is Write for a caller that already knows the journal's mark
// as it is now (the wrapper, through its journal.Writer: Writer.Tail), so
// that the journal is not opened and read back for each record.
func WriteMarked(d *rundir.Dir, r *Record, durable bool, m journal.Mark) error {
	r.Schema = Schema
	if m.Seq > 0 {
		r.JournalSeq, r.JournalHash = m.Seq, m.Hash
	}
	b, err := Marshal(r)
	if err != nil {
		return err
	}
	how := rundir.Synced
	if durable {
		how = rundir.Durable
	}
	if err := d.WriteAtomic(rundir.StatusFile, b, how); err != nil {
		return err
	}
	if durable {
		_, _ = d.RemoveStaleTemps(rundir.StatusFile)
	}
	return nil
}
