// Package ledger is the controller's record of the runs it started on other
// hosts. It has two backends behind one interface, Store:
//
//   - Files (the default, nothing to set up): one file, RUN_ID.json, per run,
//     in a directory kept under the same safety rules as a run root (a real
//     directory, owned by the effective user, not writable by group or
//     others, mode 0700 when created). See Ledger.
//   - PostgreSQL, for a fleet of runners sharing one ledger: a
//     postgres:// or postgresql:// URL (libpq conventions). See Postgres.
//
// Both keep the same records, in the same states, under the same rules:
//   - Create and Update return only once the record is durable (files:
//     fsynced file and directory; PostgreSQL: a committed transaction). A
//     controller killed at any moment leaves either the previous record or
//     the new one, never a mix.
//   - Create claims the ID: it fails with ErrExists, writing nothing, when
//     the ledger already holds a record of that ID.
//   - One owner. The controller that created a run owns it (Record.
//     Controller) and renews Record.HeartbeatAt while it drives it
//     (Heartbeat, one write for all its runs). Its Update fails with ErrLost,
//     writing nothing, once the stored record is settled: a settle by
//     someone else is never overwritten.
//   - Claim takes a run for settling, exclusively: a second Claim of the
//     same run while the first holds it fails with ErrBusy (PostgreSQL:
//     SELECT ... FOR UPDATE SKIP LOCKED; files: a lock file), and the
//     settling write is made under the claim.
//
// Whether an owner is gone is OwnerGone's judgement: a heartbeat older than
// the run's give-up time is gone on any machine (a frozen owner is gone);
// the same machine (host name and boot ID) also asks its process table.
package ledger

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// States of a ledger record, in the order a run passes through them.
const (
	Launching       = "launching"        // written before the first connection
	Running         = "running"          // the host reported the run running
	Detached        = "detached"         // the stream was lost; the run lives on the host
	CancelRequested = "cancel_requested" // INT, TERM or HUP reached the controller
	Settled         = "settled"          // the outcome is recorded
)

// Outcomes of a settled record.
const (
	Completed  = "completed"   // the run finished; exit_code is the job's, as run gives it
	Cancelled  = "cancelled"   // the run was stopped (cancel, lease, signal) with cleanup confirmed
	Unknown    = "unknown"     // the host could not say (see reason)
	NotStarted = "not_started" // the host never claimed the run ID
)

// Record is one run as the controller knows it. Fields are set as the run
// goes; zero values are omitted from the file.
type Record struct {
	Schema     int      `json:"schema"`
	RunID      string   `json:"run_id"`
	Dest       string   `json:"dest"`
	State      string   `json:"state"`
	Outcome    string   `json:"outcome,omitempty"`
	ExitCode   *int     `json:"exit_code,omitempty"`
	Cause      string   `json:"cause,omitempty"`
	Reason     string   `json:"reason,omitempty"` // why detached, why unknown or not started
	Rsh        []string `json:"rsh"`
	RemoteBin  string   `json:"remote_bin"`
	RemoteRoot string   `json:"remote_root,omitempty"`
	Command    []string `json:"command"`
	Lease      float64  `json:"lease_seconds"`
	Grace      float64  `json:"grace_seconds"`
	RemotePID  int      `json:"remote_pid,omitempty"`
	RemotePGID int      `json:"remote_pgid,omitempty"`
	BootID     string   `json:"boot_id,omitempty"`
	// HTTP are the run's credential gateways (agent-wrap ssh --http), without
	// their secrets.
	HTTP []HTTPGateway `json:"http,omitempty"`
	// StdoutBytes and StderrBytes count what the controller delivered of
	// each stream (written to its own stdout and stderr), as of the last
	// update. StdoutClosed and StderrClosed say that a write failed, the
	// reader having gone away (as with '| head'): nothing more of that
	// stream was delivered, and the run was cancelled.
	StdoutBytes  int64     `json:"stdout_bytes,omitempty"`
	StderrBytes  int64     `json:"stderr_bytes,omitempty"`
	StdoutClosed bool      `json:"stdout_closed,omitempty"`
	StderrClosed bool      `json:"stderr_closed,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
	SettledAt    time.Time `json:"settled_at,omitzero"`
	// ControllerPID is the process that drives the run, while it does.
	ControllerPID   int    `json:"controller_pid,omitempty"`
	ControllerStart uint64 `json:"controller_start,omitempty"` // its start time, clock ticks since boot
	// CancelRequested stays true once INT, TERM or HUP reached the controller.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// Controller is the run's owner, the controller that created it; it
	// stays in the record once the run is settled. HeartbeatAt is when the
	// owner last said it drives the run; GiveUp is the owner's --give-up in
	// seconds, past which a silent owner elsewhere counts as gone.
	Controller  *Owner    `json:"controller,omitempty"`
	HeartbeatAt time.Time `json:"heartbeat_at,omitzero"`
	GiveUp      float64   `json:"give_up_seconds,omitempty"`
	// SettledBy is the process that settled the run when it was not the
	// owner: a settle, here or on another machine.
	SettledBy *Owner `json:"settled_by,omitempty"`
}

// Code returns the exit code a controller gives for the record: the run's
// exit code when it is known, else 255.
func (r *Record) Code() int {
	if r.ExitCode != nil && (r.Outcome == Completed || r.Outcome == Cancelled) {
		return *r.ExitCode
	}
	return 255
}

// MarkSettled sets the record's final word: state settled, the outcome, the
// exit code (code < 0: none), cause and reason, settled_at now; the run is
// no longer driven by a controller. The caller writes it with Update.
func (r *Record) MarkSettled(outcome string, code int, cause, reason string) {
	r.State, r.Outcome, r.Cause, r.Reason = Settled, outcome, cause, reason
	r.ExitCode = nil
	if code >= 0 {
		r.ExitCode = &code
	}
	r.SettledAt = time.Now().UTC()
	r.ControllerPID, r.ControllerStart = 0, 0
}

// Driven reports whether the record says a controller is driving the run:
// not settled, and not released by its controller (which clears
// ControllerPID when it gives up).
func (r *Record) Driven() bool { return r.State != Settled && r.ControllerPID > 0 }

// Owner names one controller process: host name, boot ID, PID and start
// time (clock ticks since boot), the four together unique across a fleet.
type Owner struct {
	Host   string `json:"host"`
	BootID string `json:"boot_id,omitempty"`
	PID    int    `json:"pid"`
	Start  uint64 `json:"start,omitempty"`
}

// String is HOST:PID, how --controller names a process.
func (o *Owner) String() string { return fmt.Sprintf("%s:%d", o.Host, o.PID) }

// SameMachine reports whether o and p run on one machine in one boot.
func (o *Owner) SameMachine(p *Owner) bool {
	return o != nil && p != nil && o.Host == p.Host && o.BootID != "" && o.BootID == p.BootID
}

// Match reports whether o is selected by --controller sel: HOST (any of
// its processes) or HOST:PID.
func (o *Owner) Match(sel string) bool {
	if o == nil {
		return false
	}
	host, pid, hasPID := strings.Cut(sel, ":")
	return host == o.Host && (!hasPID || pid == fmt.Sprint(o.PID))
}

// OwnerGone reports whether the run's owner no longer drives it, judged by
// self at now (the ledger's clock: the database's for PostgreSQL). alive
// answers for a process of this machine (PID and start time). The rules:
//   - released (not Driven): gone;
//   - an owner whose heartbeat (else its last write) is older than the run's
//     give-up time: gone, wherever it runs. A process that lives but has
//     not renewed it (SIGSTOPped, hung) drives nothing; when it wakes, its
//     write is refused (ErrLost) once someone has settled the run;
//   - else an owner on this machine (host and boot ID): gone when its
//     process is;
//   - a record without an owner's identity (an older controller's, with no
//     heartbeat): gone when its process is.
func OwnerGone(r *Record, self *Owner, now time.Time, alive func(pid int, start uint64) bool) bool {
	if !r.Driven() {
		return true
	}
	if r.Controller == nil || r.Controller.SameMachine(self) {
		if self != nil && r.ControllerPID == self.PID && (r.ControllerStart == 0 || r.ControllerStart == self.Start) {
			return true // this very process, which does not drive it
		}
		if r.Controller != nil && !r.lastBeat().IsZero() && r.heartbeatOlderThanGiveUp(now) {
			return true // alive, perhaps, but frozen
		}
		return alive == nil || !alive(r.ControllerPID, r.ControllerStart)
	}
	return r.heartbeatOlderThanGiveUp(now)
}

// heartbeatOlderThanGiveUp reports whether the owner's last heartbeat (else
// its last write: every write of the owner's is a heartbeat too) is older
// than the run's give-up time at now.
func (r *Record) heartbeatOlderThanGiveUp(now time.Time) bool {
	return now.Sub(r.lastBeat()) > r.GiveUpAfter()
}

// lastBeat is the owner's last heartbeat, else its last write.
func (r *Record) lastBeat() time.Time {
	if r.HeartbeatAt.IsZero() {
		return r.UpdatedAt
	}
	return r.HeartbeatAt
}

// GiveUpAfter is the run's give-up time: as recorded, else the default
// (lease + grace + 30 s).
func (r *Record) GiveUpAfter() time.Duration {
	if r.GiveUp > 0 {
		return time.Duration(r.GiveUp * float64(time.Second))
	}
	return time.Duration((r.Lease+r.Grace)*float64(time.Second)) + 30*time.Second
}

// Errors of the ledger, whichever the backend.
var (
	// ErrExists is returned by Create when the ledger already holds the run ID.
	ErrExists = errors.New("run ID already in the ledger")
	// ErrNoRecord is returned by Read for a run ID the ledger does not hold.
	ErrNoRecord = errors.New("no such run in the ledger")
	// ErrLost is returned by an owner's Update of a run settled by someone
	// else: nothing was written.
	ErrLost = errors.New("the run was settled by someone else")
	// ErrBusy is returned by Claim for a run another settle holds.
	ErrBusy = errors.New("another settle holds the run")
	// ErrBadURL: the ledger URL does not parse.
	ErrBadURL = errors.New("bad ledger URL")
	// ErrDenied: the database refused the login or the access
	// (authentication, pg_hba.conf, privileges).
	ErrDenied = errors.New("the database refused access")
	// ErrUnreachable: no answer from the database (nothing listening, a
	// broken connection, a server shutting down). Worth retrying.
	ErrUnreachable = errors.New("cannot reach the ledger's database")
	// ErrNoDatabase: the server has no database of the URL's name
	// (NoDatabaseError names the createdb command that makes it).
	ErrNoDatabase = errors.New("no such database")
	// ErrNoSchema: the database holds no ledger yet ('agent-wrap ledger init').
	ErrNoSchema = errors.New("the database holds no agent-wrap ledger")
	// ErrSchema: the ledger's schema is not the one this agent-wrap knows
	// (newer, or older and not migrated).
	ErrSchema = errors.New("the ledger's schema is not this agent-wrap's")
)

// Store is a ledger: files or PostgreSQL. Its methods are safe for
// concurrent use (a Postgres serves them one at a time on its connection).
type Store interface {
	// Create writes the first record of a run, durably; ErrExists if the
	// ID is taken (nothing written).
	Create(ctx context.Context, r *Record) error
	// Update replaces the run's record, durably, as its owner: ErrLost
	// (nothing written) when the stored record is settled.
	Update(ctx context.Context, r *Record) error
	// Read returns the run's record; ErrNoRecord if the ledger has none.
	Read(ctx context.Context, id string) (*Record, error)
	// List returns the records f selects, sorted by run ID. A record that
	// cannot be read is left out and named in the error, which comes with
	// the others.
	List(ctx context.Context, f Filter) ([]*Record, error)
	// Heartbeat sets heartbeat_at to now for those of the runs ids that o
	// drives and that are not settled, in one write.
	Heartbeat(ctx context.Context, o *Owner, ids []string) error
	// Claim takes run id for settling: ErrBusy when another holds it,
	// ErrNoRecord when there is none. The caller ends it with Settle or
	// Release.
	Claim(ctx context.Context, id string) (*Claim, error)
	// String names the ledger for messages: a path, or the URL without
	// its password.
	String() string
	Close() error
}

// Filter selects records for List.
type Filter struct {
	Controller string // HOST or HOST:PID (Owner.Match); "": all
	Unsettled  bool   // only runs not settled, or settled unknown (what settle may learn more of)
}

func (f Filter) match(r *Record) bool {
	if f.Controller != "" && !r.Controller.Match(f.Controller) {
		return false
	}
	return !f.Unsettled || r.State != Settled || r.Outcome == Unknown
}

// Claim is a run taken for settling: Record as stored, Now the ledger's
// clock at the claim (for OwnerGone).
type Claim struct {
	Record  *Record
	Now     time.Time
	settle  func(ctx context.Context, r *Record) error
	release func()
	done    bool
}

// Settle writes r, the settled record, under the claim and ends it.
func (c *Claim) Settle(ctx context.Context, r *Record) error {
	if c.done {
		return errors.New("ledger: the claim has ended")
	}
	c.done = true
	return c.settle(ctx, r)
}

// Release ends the claim without writing; after Settle it does nothing.
func (c *Claim) Release() {
	if !c.done {
		c.done = true
		c.release()
	}
}

// IsURL reports whether s names a PostgreSQL ledger rather than a directory.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// Open opens the ledger s names for a short command: a postgres:// or
// postgresql:// URL (one connection, the schema checked), else a
// directory (OpenFiles; create makes it).
func Open(ctx context.Context, s string, create bool) (Store, error) {
	if IsURL(s) {
		return OpenPostgres(ctx, s, false)
	}
	return OpenFiles(s, create)
}

// OpenForController opens the ledger s names for a controller, which
// writes from many goroutines and keeps going while a database is away: a
// URL gets its connection at the first call (and again after it breaks);
// a directory is made if missing.
func OpenForController(ctx context.Context, s string) (Store, error) {
	if IsURL(s) {
		return OpenPostgres(ctx, s, true)
	}
	return OpenFiles(s, true)
}

// Resolve returns the ledger: flag, else $AGENT_WRAP_LEDGER, else
// $XDG_STATE_HOME/agent-wrap/ledger, else ~/.local/state/agent-wrap/ledger.
// A directory comes back absolute, a URL as it is. A value with "://" whose
// scheme is not postgres or postgresql is refused with ErrBadURL.
func Resolve(flag string, getenv func(string) string) (string, error) {
	p := flag
	if p == "" {
		p = getenv("AGENT_WRAP_LEDGER")
	}
	if p == "" {
		if x := getenv("XDG_STATE_HOME"); x != "" {
			p = filepath.Join(x, "agent-wrap", "ledger")
		}
	}
	if p == "" {
		home := getenv("HOME")
		if home == "" {
			return "", errors.New("cannot place the ledger: no --ledger, $AGENT_WRAP_LEDGER, $XDG_STATE_HOME or $HOME")
		}
		p = filepath.Join(home, ".local", "state", "agent-wrap", "ledger")
	}
	if IsURL(p) {
		return p, nil
	}
	if scheme, _, ok := strings.Cut(p, "://"); ok {
		// A URL of another database, or a misspelt postgres://: never a
		// directory named after it.
		return "", fmt.Errorf("%w %s: the scheme %q is not understood; agent-wrap knows postgres:// and postgresql:// (a directory ledger is a path, with no scheme)", ErrBadURL, Redact(p), scheme)
	}
	return filepath.Abs(p)
}

// NewID returns a fresh run ID: 128 bits from crypto/rand, in lowercase
// base32 without padding (26 characters of [a-z2-7]), a valid run ID.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("ledger: crypto/rand: " + err.Error()) // never fails on Linux
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	var out strings.Builder
	var acc uint32
	bits := 0
	for _, c := range b {
		acc = acc<<8 | uint32(c)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out.WriteByte(alphabet[(acc>>bits)&31])
		}
	}
	if bits > 0 {
		out.WriteByte(alphabet[(acc<<(5-bits))&31])
	}
	return out.String()
}
