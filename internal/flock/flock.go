//go:build linux || darwin || freebsd

// Package flock takes flock(2) locks, the one place that knows how: a
// blocking wait (Lock), and a wait that a context can end (Poll). Both
// take the lock again when a signal interrupts the call (EINTR), so a
// caller never mistakes an interrupted wait for a lock it could not have.
//
// It locks an open file descriptor and nothing else: opening the file,
// naming it in errors and unlocking (close, or LOCK_UN) are the caller's.
// Errors are the bare errno (unix.EWOULDBLOCK, ...) or the context's, for
// the caller to wrap with its path.
package flock

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is flock(fd, how), again after EINTR. how is unix.LOCK_EX or
// unix.LOCK_SH, with unix.LOCK_NB for a single try (a lock held elsewhere
// is then unix.EWOULDBLOCK), or unix.LOCK_UN.
func Lock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

// Poll takes the lock how (unix.LOCK_EX or unix.LOCK_SH) on fd, waiting
// while another open file holds it until ctx ends. A blocked flock(2)
// cannot be given a time limit, so it polls: it tries without blocking,
// and while the lock is held pauses 1 ms, then twice as long each time up
// to maxPause (a burst of waiters must not burn the CPU). It tries at
// least once, even when ctx has ended already. It returns nil with the
// lock held, ctx.Err() when ctx ends first, or flock's error.
func Poll(ctx context.Context, fd, how int, maxPause time.Duration) error {
	pause := time.Millisecond
	var t *time.Timer
	for {
		err := Lock(fd, how|unix.LOCK_NB)
		if err != unix.EWOULDBLOCK {
			if t != nil {
				t.Stop()
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			if t != nil {
				t.Stop()
			}
			return err
		}
		if t == nil {
			t = time.NewTimer(pause)
		} else {
			t.Reset(pause)
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, maxPause)
	}
}
