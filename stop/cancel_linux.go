package stop

import (
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// ErrNotConfirmed is returned (wrapped) by Cancel when the run's wrapper is
// alive but has not written a final record within the wait.
var ErrNotConfirmed = errors.New("not confirmed")

// ErrNoRecord is returned (wrapped) by Cancel when the run's record cannot
// be read: nothing was signalled.
var ErrNoRecord = errors.New("cannot read the run's record")

// CancelOptions describe a cancel.
type CancelOptions struct {
	// Grace is the time between TERM and KILL when Cancel stops the run
	// itself; negative means the run's own grace_seconds.
	Grace time.Duration
	// Wait bounds how long Cancel waits for a live wrapper's final record.
	Wait time.Duration
	// PID is the canceller's PID, journaled with the intent.
	PID int
	// Diag receives what went wrong on the way that did not stop the cancel.
	Diag io.Writer
}

// Cancel is the cancel protocol, the second control channel. A terminal run
// is returned as it is (Report.Already). With the wrapper alive (PID and
// start time verified), the cancel is recorded (Intend, by "cancel"), the
// wrapper is sent TERM, and Cancel waits up to o.Wait for its final record;
// if the wrapper dies meanwhile, or was dead from the start, Cancel performs
// the validated, ordered stop itself (Outside). The report's record is the
// final one; whether cleanup is confirmed is the caller's reading of its
// state and survivors.
func Cancel(d *rundir.Dir, o CancelOptions) (*Report, error) {
	if o.Diag == nil {
		o.Diag = io.Discard
	}
	until := time.Now().Add(o.Wait)
	rec, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRecord, err)
	}
	if statusfile.Terminal(rec.State) {
		Options{By: "cancel", Diag: o.Diag}.complete(d)
		return &Report{Record: rec, Already: true}, nil
	}
	if membership.WrapperAlive(rec) {
		// Pin the wrapper: it exits a moment after its final record, so
		// its pidfd is what to wait on. (A file watch would do too, but
		// closing an inotify descriptor costs this short-lived command an
		// RCU grace period, 5-25 ms; it is the fallback without pidfds.)
		wid := proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}
		wr, perr := proc.Pin(wid)
		var w *rundir.Watcher
		if perr != nil {
			w = d.Watch()
			defer w.Close()
		} else {
			defer wr.Close()
		}
		final, err := requestCancel(d, o.PID, min(rundir.LockWait, time.Until(until)))
		if final != nil {
			return &Report{Record: final, Already: true}, nil
		}
		if err != nil {
			if !errors.Is(err, errNotRecorded) {
				return nil, fmt.Errorf("run %s: %w", d.ID, err)
			}
			fmt.Fprintf(o.Diag, "agent-wrap: run %s: %v\n", d.ID, err)
		}
		err = Signal(wid, unix.SIGTERM)
		if err != nil && !errors.Is(err, proc.ErrGone) {
			fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot signal the wrapper %d: %v\n", d.ID, rec.WrapperPID, err)
		}
		// The record is read again after each wait: every millisecond
		// for the first 100 ms (a stop takes a few; the final record is
		// written about a millisecond before the wrapper exits), then
		// doubling to 100 ms, for a wrapper in a long grace or one that
		// lives on after its final record to drain its output to a slow
		// reader.
		pause, fast := time.Millisecond, time.Now().Add(100*time.Millisecond)
		for time.Now().Before(until) {
			cur, err := statusfile.Read(d)
			if err == nil && statusfile.Terminal(cur.State) {
				return &Report{Record: cur}, nil
			}
			if err == nil && !wrapperAlive(wr, cur) {
				// The final record may have landed since the read.
				if cur, err := statusfile.Read(d); err == nil && statusfile.Terminal(cur.State) {
					return &Report{Record: cur}, nil
				}
				break // the wrapper died mid-stop: finish the job ourselves
			}
			if wr != nil {
				wr.Wait(min(pause, time.Until(until)))
				if time.Now().After(fast) {
					pause = min(2*pause, 100*time.Millisecond)
				}
			} else {
				w.Wait(100 * time.Millisecond)
			}
		}
		if !time.Now().Before(until) {
			return nil, fmt.Errorf("run %s: %w within %v: the wrapper (pid %d) has not written a final record", d.ID, ErrNotConfirmed, o.Wait, rec.WrapperPID)
		}
	}
	g := o.Grace
	if g < 0 {
		g = time.Duration(rec.GraceSeconds * float64(time.Second))
	}
	return Outside(d, Options{Grace: g, Cause: statusfile.CauseCancel, Intent: "cancel_requested", By: "cancel", Diag: o.Diag, Fields: journal.Fields{"pid": o.PID},
		LockWait: min(max(time.Until(until), time.Second), rundir.LockWait)})
}

// wrapperAlive: the pinned wrapper has not exited, or, without a pin, the
// record's wrapper is alive.
func wrapperAlive(wr *proc.Pinned, rec *statusfile.Record) bool {
	if wr != nil {
		return !wr.Exited()
	}
	return membership.WrapperAlive(rec)
}

// requestCancel records the cancel under the run's lock, waiting for it at
// most wait, unless the run is already over or stopping, in which case its
// first cause stands. A final record found (at once, or after this
// process was stuck while it held the lock and the run was stopped
// without it) is returned, and nothing is written.
func requestCancel(d *rundir.Dir, pid int, wait time.Duration) (*statusfile.Record, error) {
	unlock, err := d.LockWithin(wait)
	if err != nil {
		return nil, fmt.Errorf("cannot record the cancel: %w", err)
	}
	defer unlock()
	rec, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		return nil, err
	}
	if statusfile.Terminal(rec.State) {
		return rec, nil
	}
	if rec.State == statusfile.Cancelling {
		return nil, nil
	}
	_, err = Intend(d, rec, rec, "cancel_requested", statusfile.CauseCancel, journal.Fields{"by": "cancel", "pid": pid}, nil, writeRecord(d))
	if errors.Is(err, errTakenOver) {
		final, rerr := statusfile.Read(d)
		if rerr != nil {
			return nil, rerr
		}
		return final, nil
	}
	if errors.Is(err, errNotJournaled) {
		return nil, fmt.Errorf("%w, so nothing was signalled", err)
	}
	return nil, err
}
