// Package proc reads Linux process facts from /proc; it never signals.
// On macOS and FreeBSD, where a controller runs, it reads only ReadStat's
// fields, through sysctl kern.proc.pid.
//
// A PID read from a file is a claim, not a fact: PIDs are recycled. The
// identity of a process here is (PID, start time in clock ticks since boot,
// boot ID): Identity is what a process must match, and Identity.Check
// compares a live Stat with it. stop.Signal checks it through a pidfd before
// it sends anything. Alive is the one answer to "does the process recorded
// as (PID, start) still run?", a zombie counting as dead.
package proc

import (
	"errors"
	"fmt"
	"strconv"
)

// Stat is what agent-wrap needs of /proc/PID/stat.
type Stat struct {
	PID   int
	Comm  string
	State byte // R, S, D, Z, T, t, X, I, ...
	PPID  int
	PGID  int
	SID   int
	// Start is the start time in clock ticks since boot (field 22); on
	// macOS and FreeBSD, microseconds since the epoch.
	Start uint64
	// Threads is the number of threads in the process (field 20); 0 on
	// macOS and FreeBSD.
	Threads int
}

// Dead reports whether the process runs nothing any more: a zombie (Z) or
// dying (X). A zombie keeps its PID until it is reaped, which PID 1 on these
// machines does only every second or two, so callers count Z as dead.
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' }

// ErrGone is returned (wrapped) when the process does not exist.
var ErrGone = errors.New("no such process")

// goneError is ErrGone for one PID ("pid N: no such process"). It is a
// number, not a formatted string: a wrapper's look reads the stat of every
// PID handed out since its last one, most of them gone, and a wrapper that
// never collects its garbage keeps every byte it made resident.
type goneError int

func (e goneError) Error() string { return "pid " + strconv.Itoa(int(e)) + ": " + ErrGone.Error() }
func (goneError) Unwrap() error   { return ErrGone }

// errMismatch is returned (wrapped) when a process exists but is not the
// one recorded: another start time, group or session.
var errMismatch = errors.New("process identity mismatch")

// Identity is a recorded process: what a signal must match.
type Identity struct {
	PID   int
	Start uint64 // 0: do not check the start time
	PGID  int    // 0: do not check
	SID   int    // 0: do not check
	// MinStart, if set, requires the process to have started no earlier
	// than this (a group member cannot predate its leader).
	MinStart uint64
}

// Check compares a live Stat with the identity.
func (id Identity) Check(s Stat) error {
	switch {
	case s.PID != id.PID:
		return fmt.Errorf("pid %d: %w: stat is for pid %d", id.PID, errMismatch, s.PID)
	case id.Start != 0 && s.Start != id.Start:
		return fmt.Errorf("pid %d: %w: started at tick %d, recorded %d (PID reused)", id.PID, errMismatch, s.Start, id.Start)
	case id.PGID != 0 && s.PGID != id.PGID:
		return fmt.Errorf("pid %d: %w: process group %d, recorded %d", id.PID, errMismatch, s.PGID, id.PGID)
	case id.SID != 0 && s.SID != id.SID:
		return fmt.Errorf("pid %d: %w: session %d, recorded %d", id.PID, errMismatch, s.SID, id.SID)
	case id.MinStart != 0 && s.Start < id.MinStart:
		return fmt.Errorf("pid %d: %w: started at tick %d, before the run's leader (%d)", id.PID, errMismatch, s.Start, id.MinStart)
	}
	return nil
}

// Alive reports whether pid is a process that runs on this machine now:
// it exists, is not a zombie or dying (Stat.Dead: a zombie runs nothing,
// and PID 1 may reap it late), and, when start is not 0, it started at
// start, so its PID has not been recycled since. start 0 means the start
// time is not known, and any start matches (as Identity.Start 0 does); a
// caller about to signal on the answer records the start and passes it.
// A pid below 1 is never alive.
//
// This is the one answer to "is the process recorded as (pid, start)
// still running?" for judges, controllers and tests alike. It reads; to
// signal with the identity checked at the last moment, see stop.Signal.
func Alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := ReadStat(pid)
	return err == nil && !st.Dead() && (start == 0 || st.Start == start)
}
