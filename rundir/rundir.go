// Package rundir holds the run root and the run directories below it: run-ID
// validation, the safety checks on the root, the mkdir claim on an ID, files
// opened without following symlinks, atomic replacement and the per-run lock
// (a flock on the run directory itself, never waited for without a bound: a
// lock still held at the end of the wait names its holders, HeldError).
//
// Guarantees: a run ID that fails ValidID never reaches the file system; a
// root that is a symlink, not owned by the effective user or writable by group
// or others is refused with ErrUnsafe before anything is created below it;
// every file below a run directory is opened relative to the directory's file
// descriptor with O_NOFOLLOW, so a symlink planted in place of a file is an
// error, never followed; temp files and renames are relative to it too. Not
// guaranteed: that a directory is not renamed away between two calls (its
// path is kept for messages and for RemoveAll; Root.Holds tells); that a
// replacement is atomic on a full file system, where WriteAtomic overwrites
// an existing file in place rather than fail.
package rundir

import (
	"errors"
	"fmt"
	"path/filepath"
)

// IDPattern is the grammar of a run ID.
const IDPattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`

// idChar reports whether c may follow the first character of a run ID.
func idChar(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// matchID is IDPattern by hand: a regexp with {0,127} costs ~3 ms and 1,700
// allocations to compile at every process start.
func matchID(id string) bool {
	if id == "" || len(id) > 128 || !idChar(id[0]) || id[0] == '.' || id[0] == '_' || id[0] == '-' {
		return false
	}
	for i := 1; i < len(id); i++ {
		if !idChar(id[i]) {
			return false
		}
	}
	return true
}

// ErrBadID is returned (wrapped) for a run ID that does not match IDPattern.
var ErrBadID = errors.New("invalid run ID")

// ErrUnsafe is returned (wrapped) for a root or run directory that is a
// symlink, owned by someone else or writable by group or others. Ask with
// errors.Is(err, ErrUnsafe).
var ErrUnsafe = errors.New("unsafe")

// ErrExists is returned by Root.Create when the ID is already claimed.
var ErrExists = errors.New("run ID already exists")

// ErrNoRun is returned by Root.Open when there is no run with that ID.
var ErrNoRun = errors.New("no such run")

// ValidID reports whether id is a valid run ID.
func ValidID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrBadID)
	case len(id) > 128:
		return fmt.Errorf("%w: %d characters, at most 128", ErrBadID, len(id))
	case !matchID(id):
		return fmt.Errorf("%w %q: must match %s", ErrBadID, id, IDPattern)
	}
	return nil
}

// ResolveRoot picks the run root: flag, else $AGENT_WRAP_ROOT, else
// $HOME/.agent-runs. The result is absolute and clean.
func ResolveRoot(flag string, getenv func(string) string) (string, error) {
	p := flag
	if p == "" {
		p = getenv("AGENT_WRAP_ROOT")
	}
	if p == "" {
		home := getenv("HOME")
		if home == "" {
			return "", errors.New("cannot choose a run root: no --root, AGENT_WRAP_ROOT or HOME")
		}
		p = filepath.Join(home, ".agent-runs")
	}
	return filepath.Abs(p)
}

// Names of the files in a run directory.
const (
	StatusFile   = "status.json"
	PIDFile      = "pid"
	PGIDFile     = "pgid"
	DeadlineFile = "deadline_epoch"
	StdoutFile   = "stdout.log"
	StderrFile   = "stderr.log"
	EventsFile   = "events.jsonl"
	LockFile     = "lock"
)
