package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/rundir"
)

// ServeOptions configure Serve.
type ServeOptions struct {
	// Options are each pass's. Serve sets Progress (to a WATCHDOG=1
	// ping); Diag also gets Serve's own messages, one "agent-wrap: " line
	// each.
	Options
	// Once makes one pass and returns, as cron wants. A root whose lock
	// another watchdog holds is left to that one.
	Once bool
	// Interval is the time between passes when not Once; it must be
	// positive. Passes come more often when the service manager wants
	// pings more often (Notifier.WatchdogInterval).
	Interval time.Duration
	// Out gets one JSON line per Action; nil discards them.
	Out io.Writer
}

// lockRetry is how often a waiting service tries the lock again.
const lockRetry = time.Second

// StaleAfter is how long the lock file may go untouched before its holder
// is taken to be no longer at work: a watchdog touches it every second
// while it holds it (touchEvery).
const StaleAfter = 30 * time.Second

const touchEvery = time.Second

// Serve is the watchdog service: it holds root's LockFile (one watchdog
// per root) and makes a Pass over every run, once (o.Once) or every
// o.Interval until ctx ends, printing each action as a JSON line on o.Out.
// The stops a pass decides on run side by side and, in the service, past
// the pass: a run in a long grace delays neither the next pass nor any
// other run's stop. Serve returns after the stops it started have ended.
//
// Unless Once, it tells sd "READY=1" at once, "WATCHDOG=1" after every run
// looked at, every pass and every second spent waiting for the lock, and
// "STOPPING=1" when ctx ends after it served. A service waits its turn for
// a lock another watchdog holds (saying so on o.Diag, once) instead of
// failing; with Once the pass is left to the holder. A holder that is
// stopped (SIGSTOP), or has not touched the lock file for StaleAfter, is
// not at work: it is passed over (said on o.Diag), and the passes are made
// without the lock, the service trying it again at each one.
//
// A pass that cannot list the root is reported on o.Diag and the service
// goes on. Serve returns an error only when the lock cannot be tried (the
// root is unwritable, say); a root left to another watchdog, and ctx
// ending, are a nil return.
func Serve(ctx context.Context, root *rundir.Root, o ServeOptions, sd Notifier) error {
	if !o.Once && o.Interval <= 0 {
		return errors.New("watchdog: the interval between passes must be positive")
	}
	if o.Diag == nil {
		o.Diag = io.Discard
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	ping := func() { sd.Notify("WATCHDOG=1") }
	if !o.Once {
		sd.Notify("READY=1")
	}
	var encMu sync.Mutex
	enc := json.NewEncoder(o.Out)
	o.Progress = ping
	o.unrecorded = &runSet{m: map[string]bool{}}
	l := &lock{root: root, diag: o.Diag}
	defer l.release() // after the stops below have ended
	s := newStopper(o.Options, func(a Action) { encMu.Lock(); enc.Encode(a); encMu.Unlock() })
	defer s.wait()
	pass := func() {
		if err := s.pass(root); err != nil {
			fmt.Fprintf(o.Diag, "agent-wrap: watchdog pass over %s: %v\n", root.Path, err)
		}
	}
	if o.Once {
		ok, err := l.take()
		if err != nil || !ok {
			if err == nil {
				// Overlapping cron passes are normal: the other one does the work.
				fmt.Fprintf(o.Diag, "agent-wrap: another watchdog is running for %s; leaving this pass to it\n", root.Path)
			}
			return err
		}
		pass()
		return nil
	}

	every := o.Interval
	if wd := sd.WatchdogInterval; wd > 0 && wd < every {
		every = wd // already half of WatchdogSec=, as sd_watchdog_enabled(3) advises
	}
	served, waitSaid := false, false
	for {
		ok, err := l.take()
		if err != nil {
			return err
		}
		next := every
		if ok {
			served = true
			pass()
		} else {
			// A service waits its turn instead of failing and being
			// restarted in a loop while, say, a manual --once holds the lock.
			if !waitSaid {
				fmt.Fprintf(o.Diag, "agent-wrap: another watchdog is running for %s; waiting for it to finish\n", root.Path)
				waitSaid = true
			}
			next = lockRetry
		}
		ping()
		select {
		case <-ctx.Done():
			if served {
				sd.Notify("STOPPING=1")
			}
			return nil
		case <-time.After(next):
		}
	}
}

// lock is a watchdog's hold on the root's LockFile: taken, touched every
// touchEvery while held, or passed over when its holder is stale.
type lock struct {
	root      *rundir.Root
	diag      io.Writer
	unlock    func()
	staleSaid string // the holder last said to be passed over
}

// take tries the lock unless it is held already. It reports whether a pass
// may be made: the lock is ours, or its holder is stale.
func (l *lock) take() (bool, error) {
	if l.unlock != nil {
		return true, nil
	}
	unlock, err := l.root.TryLock(LockFile)
	if err == nil {
		stop := make(chan struct{})
		done := make(chan struct{})
		_ = l.root.Touch(LockFile)
		go func() {
			defer close(done)
			t := time.NewTicker(touchEvery)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_ = l.root.Touch(LockFile)
				}
			}
		}()
		l.unlock = func() { close(stop); <-done; unlock() }
		return true, nil
	}
	var held *rundir.HeldError
	if !errors.As(err, &held) {
		return false, err
	}
	why := l.stale(held)
	if why == "" {
		return false, nil
	}
	if why != l.staleSaid {
		fmt.Fprintf(l.diag, "agent-wrap: the watchdog holding %s is %s; passing it over\n", held.Path, why)
		l.staleSaid = why
	}
	return true, nil
}

// stale says why the lock's holder is not at work ("" if it is): it is
// stopped, or the lock file has not been touched for StaleAfter.
func (l *lock) stale(held *rundir.HeldError) string {
	for _, h := range held.Holders {
		if h.Self {
			return "" // another Serve of this process
		}
	}
	if held.Stopped() {
		return held.Holders[0].String()
	}
	if age, err := l.root.Age(LockFile); err == nil && age > StaleAfter {
		who := "a process that could not be seen"
		if h, ok := held.Holder(); ok {
			who = h.String()
		}
		return fmt.Sprintf("%s, which has not touched it for %v", who, age.Truncate(time.Second))
	}
	return ""
}

func (l *lock) release() {
	if l.unlock != nil {
		l.unlock()
		l.unlock = nil
	}
}
