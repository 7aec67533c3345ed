//go:build linux || darwin || freebsd

package rundir

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/flock"
)

// LockWait is how long Lock waits for a run's lock. The lock is held for
// a state transition, a few writes and an fsync, so a holder that keeps it
// this long is stuck (stopped, or in a hung file system) and waiting on
// is pointless: Lock gives up with a *HeldError naming it.
const LockWait = 5 * time.Second

// Holder is a process that holds a lock, as /proc/locks and /proc/PID tell:
// named by PID, start time and executable, never by a process name.
type Holder struct {
	PID   int
	Start uint64 // start time, clock ticks since boot
	State byte   // /proc/PID/stat's: T stopped, t stopped by a tracer, D in the kernel
	Exe   string // the executable; "" when it cannot be read
	Self  bool   // this process (another of its goroutines holds the lock)
}

// Stopped reports whether the holder is stopped (SIGSTOP, or at a tracer's
// stop): unlike one in state D, which may be a moment's fsync, it lets go
// of nothing until someone resumes it.
func (h Holder) Stopped() bool { return h.State == 'T' || h.State == 't' }

func (h Holder) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", h.PID)
	if h.Self {
		b.WriteString(" (this process)")
		return b.String()
	}
	exe := h.Exe
	if exe == "" {
		exe = "executable unreadable"
	}
	fmt.Fprintf(&b, " (%s, started at tick %d, state %c", exe, h.Start, h.State)
	switch h.State {
	case 'T', 't':
		b.WriteString(": stopped")
	case 'D':
		b.WriteString(": waiting in the kernel")
	}
	b.WriteString(")")
	return b.String()
}

// HeldError is what a bounded lock wait returns when the lock is still
// held at its end. It is ErrLocked for errors.Is.
type HeldError struct {
	Path    string        // the locked file or directory
	Waited  time.Duration // how long it was waited for
	Holders []Holder      // who holds it; empty when none could be seen (it was let go meanwhile, or the holder is in another PID namespace)
}

func (e *HeldError) Error() string {
	who := "another process"
	if len(e.Holders) > 0 {
		s := make([]string, len(e.Holders))
		for i, h := range e.Holders {
			s[i] = h.String()
		}
		who = strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s is locked by %s (waited %v)", e.Path, who, e.Waited.Round(time.Millisecond))
}

// Is makes a *HeldError ErrLocked.
func (e *HeldError) Is(target error) bool { return target == ErrLocked }

// Stopped reports whether a holder was seen and every holder seen is
// stopped (Holder.Stopped).
func (e *HeldError) Stopped() bool {
	for _, h := range e.Holders {
		if !h.Stopped() {
			return false
		}
	}
	return len(e.Holders) > 0
}

// Holder returns the first holder seen, if any.
func (e *HeldError) Holder() (Holder, bool) {
	if len(e.Holders) == 0 {
		return Holder{}, false
	}
	return e.Holders[0], true
}

// FlockWithin takes an exclusive flock on the open file fd (named path in
// errors), waiting at most wait: a lock still held then is a *HeldError
// naming its holders. The wait polls (a blocked flock cannot be given a
// time limit), every millisecond at first, then every 25 ms.
func FlockWithin(fd int, path string, wait time.Duration) error {
	return flockUntil(fd, path, unix.LOCK_EX, time.Now(), time.Now().Add(wait))
}

// flockUntil takes the flock how (LOCK_EX or LOCK_SH) on fd, trying until
// until (flock.Poll, pausing up to 25 ms between tries). A shared lock that
// is busy is a bare ErrLocked: its callers (RLock) poll it and read without
// it, and have no use for the holders' names.
func flockUntil(fd int, path string, how int, start, until time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	err := flock.Poll(ctx, fd, how, 25*time.Millisecond)
	switch {
	case err == nil:
		return nil
	case err == context.DeadlineExceeded && how == unix.LOCK_SH:
		return fmt.Errorf("%s: %w", path, ErrLocked)
	case err == context.DeadlineExceeded:
		return &HeldError{Path: path, Waited: time.Since(start), Holders: holdersOf(fd)}
	}
	return &os.PathError{Op: "flock", Path: path, Err: err}
}
