package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// ErrRefused is returned (wrapped, with the reason) when a renewal is
// refused: the run is terminal or cancelling, has no lease, or its deadline
// has already passed.
var ErrRefused = errors.New("renewal refused")

// Renew moves a run's deadline to now + d (d == 0: the run's own lease)
// under the run's lock: it journals lease_renewed, then writes
// deadline_epoch. The deadline it renews from is the journal's
// (Effective). The lock is the one the wrapper takes before it records an
// expiry, so a renewal racing the expiry has exactly one winner: either the
// deadline moved before the wrapper looked, or the expiry is on record and
// the renewal is refused.
func Renew(d *rundir.Dir, dur time.Duration) (int64, error) {
	unlock, err := d.Lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	rec, err := statusfile.Read(d)
	if err != nil {
		return 0, err
	}
	switch {
	case statusfile.Terminal(rec.State):
		return 0, fmt.Errorf("%w: run %s is %s", ErrRefused, d.ID, rec.State)
	case rec.State == statusfile.Cancelling:
		return 0, fmt.Errorf("%w: run %s is being stopped (cause %s)", ErrRefused, d.ID, rec.Cause)
	case rec.State != statusfile.Running:
		return 0, fmt.Errorf("%w: run %s is %s, not running yet", ErrRefused, d.ID, rec.State)
	}
	// The journal's deadline, not deadline_epoch's: a hand-written later
	// deadline revives nothing.
	old, _, err := Effective(d)
	if err != nil {
		if errors.Is(err, ErrNoDeadline) {
			return 0, fmt.Errorf("%w: run %s has no lease (started with --lease 0)", ErrRefused, d.ID)
		}
		return 0, fmt.Errorf("%w: run %s: its deadline cannot be read (%v), so it counts as expired; an expired lease is never revived", ErrRefused, d.ID, err)
	}
	now := time.Now()
	if !now.Before(time.Unix(old, 0)) {
		return 0, fmt.Errorf("%w: the lease of run %s expired at %s, %s ago; an expired lease is never revived",
			ErrRefused, d.ID, time.Unix(old, 0).UTC().Format(time.RFC3339), now.Sub(time.Unix(old, 0)).Truncate(time.Millisecond))
	}
	if dur <= 0 {
		dur = time.Duration(rec.LeaseSeconds * float64(time.Second))
	}
	if dur <= 0 {
		return 0, fmt.Errorf("%w: run %s has no lease length to renew with; pass --lease", ErrRefused, d.ID)
	}
	next := DeadlineAfter(now, dur)
	// The journal line is the renewal (Effective reads it); deadline_epoch
	// is its copy for readers, written after it.
	if _, err := journal.Append(d, "lease_renewed", journal.Fields{"deadline_epoch": next, "previous": old, "lease_seconds": dur.Seconds()}, false); err != nil {
		return 0, fmt.Errorf("run %s: cannot journal the renewal, so the lease was not renewed: %w", d.ID, err)
	}
	if err := WriteDeadline(d, next); err != nil {
		return next, fmt.Errorf("run %s: renewed to %d (journaled), but cannot write deadline_epoch: %w", d.ID, next, err)
	}
	return next, nil
}
