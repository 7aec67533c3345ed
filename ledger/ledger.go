// Package ledger is the controller's record of the runs it started on other
// hosts: one file, RUN_ID.json, per run, in a directory kept under the same
// safety rules as a run root (a real directory, owned by the effective user,
// not writable by group or others, mode 0700 when created).
//
// What it guarantees:
//   - Create and Update return only once the record is on disk: the record
//     is written to a temporary file in the ledger directory, fsynced, put
//     in place (Create: link(2); Update: a renameio pending file's rename),
//     and the directory is fsynced. A controller killed at any moment
//     leaves either the previous record or the new one, never a mix, and a
//     record that Create returned for is never lost to a crash.
//   - Create claims the ID: it fails with ErrExists, touching nothing, when
//     the ledger already holds a record of that ID (link(2) of the synced
//     temporary file, which fails if the name exists).
//   - Files are created 0600 and read without following symlinks; a record
//     that is a symlink or someone else's is refused with rundir.ErrUnsafe.
//
// What it does not do: it serialises nothing between two processes updating
// the same record. One controller owns a run while it runs; settle writes
// only records that are not being driven (see the controller package).
package ledger

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/rundir"
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
	// each stream (the offsets a reattach starts from), as of the last update.
	StdoutBytes int64     `json:"stdout_bytes,omitempty"`
	StderrBytes int64     `json:"stderr_bytes,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	SettledAt   time.Time `json:"settled_at,omitzero"`
	// ControllerPID is the process that drives the run, while it does.
	ControllerPID   int    `json:"controller_pid,omitempty"`
	ControllerStart uint64 `json:"controller_start,omitempty"` // its start time, clock ticks since boot
	// CancelRequested stays true once INT, TERM or HUP reached the controller.
	CancelRequested bool `json:"cancel_requested,omitempty"`
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

// ErrExists is returned by Create when the ledger already holds the run ID.
var ErrExists = errors.New("run ID already in the ledger")

// ErrNoRecord is returned by Read for a run ID the ledger does not hold.
var ErrNoRecord = errors.New("no such run in the ledger")

// Ledger is an opened, checked ledger directory.
type Ledger struct {
	Path string
}

// Resolve returns the ledger directory: flag, else $AGENT_WRAP_LEDGER,
// else $XDG_STATE_HOME/agent-wrap/ledger, else ~/.local/state/agent-wrap/ledger.
// The result is absolute.
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
	return filepath.Abs(p)
}

// Open checks the ledger directory at path with the run root's rules
// (rundir.OpenRoot), creating it (mode 0700) when create is set. A missing
// ledger without create is an error wrapping os.ErrNotExist; an unsafe one
// wraps rundir.ErrUnsafe.
func Open(path string, create bool) (*Ledger, error) {
	r, err := rundir.OpenRoot(path, create)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	r.Close()
	return &Ledger{Path: path}, nil
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

func (l *Ledger) path(id string) string { return filepath.Join(l.Path, id+".json") }

// Create writes the first record of a run, durably, and fails with
// ErrExists if the ledger already holds its ID.
func (l *Ledger) Create(r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	r.Schema = 1
	r.UpdatedAt = time.Now().UTC()
	tmp, err := l.writeTemp(r)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, l.path(r.RunID)); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("run %s: %w (%s)", r.RunID, ErrExists, l.path(r.RunID))
		}
		return err
	}
	if err := os.Remove(tmp); err != nil {
		return err
	}
	return l.syncDir()
}

// Update replaces the run's record: a renameio pending file in the ledger
// directory, fsynced, renamed over the record, then the directory fsynced
// (see the package doc).
func (l *Ledger) Update(r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	if err := l.checkFile(r.RunID); err != nil && !errors.Is(err, ErrNoRecord) {
		return err
	}
	r.Schema = 1
	r.UpdatedAt = time.Now().UTC()
	b, err := marshal(r)
	if err != nil {
		return err
	}
	t, err := renameio.NewPendingFile(l.path(r.RunID), renameio.WithTempDir(l.Path), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return err
	}
	defer t.Cleanup()
	if _, err := t.Write(b); err != nil {
		return err
	}
	if err := t.CloseAtomicallyReplace(); err != nil {
		return err
	}
	return l.syncDir()
}

func marshal(r *Record) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	return append(b, '\n'), err
}

// writeTemp writes r to a new, fsynced temporary file in the ledger
// directory and returns its path.
func (l *Ledger) writeTemp(r *Record) (string, error) {
	b, err := marshal(r)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(l.Path, "."+r.RunID+".tmp*")
	if err != nil {
		return "", err
	}
	name := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

func (l *Ledger) syncDir() error {
	d, err := os.Open(l.Path)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return &os.PathError{Op: "fsync", Path: l.Path, Err: err}
	}
	return nil
}

// checkFile refuses a record file that is not a regular file of ours.
func (l *Ledger) checkFile(id string) error {
	var st unix.Stat_t
	if err := unix.Lstat(l.path(id), &st); err != nil {
		if err == unix.ENOENT {
			return fmt.Errorf("run %s: %w (%s)", id, ErrNoRecord, l.Path)
		}
		return &os.PathError{Op: "lstat", Path: l.path(id), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return fmt.Errorf("ledger record %s is not a regular file of yours, private to you: %w", l.path(id), rundir.ErrUnsafe)
	}
	return nil
}

// Read returns the run's record; ErrNoRecord if the ledger has none.
func (l *Ledger) Read(id string) (*Record, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	if err := l.checkFile(id); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(l.path(id), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r Record
	if err := json.NewDecoder(f).Decode(&r); err != nil {
		return nil, fmt.Errorf("ledger record %s: %w", l.path(id), err)
	}
	if r.RunID != id {
		return nil, fmt.Errorf("ledger record %s names run %q", l.path(id), r.RunID)
	}
	return &r, nil
}

// List returns the run IDs the ledger holds, sorted.
func (l *Ledger) List() ([]string, error) {
	ents, err := os.ReadDir(l.Path)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && rundir.ValidID(id) == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}
