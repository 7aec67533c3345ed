package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// Serve is the watchdog service: it holds root's LockFile (one watchdog
// per root) and makes a Pass over every run, once (o.Once) or every
// o.Interval until ctx ends, printing each action as a JSON line on o.Out.
//
// Unless Once, it tells sd "READY=1" at once, "WATCHDOG=1" after every run
// looked at, every pass and every second spent waiting for the lock, and
// "STOPPING=1" when ctx ends after the lock was taken. A service waits its
// turn for a lock another watchdog holds (saying so on o.Diag, once)
// instead of failing; with Once the pass is left to the holder.
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
	var unlock func()
	for waited := false; ; waited = true {
		var err error
		unlock, err = root.TryLock(LockFile)
		if err == nil {
			break
		}
		if !errors.Is(err, rundir.ErrLocked) {
			return err
		}
		if o.Once {
			// Overlapping cron passes are normal: the other one does the work.
			fmt.Fprintf(o.Diag, "agent-wrap: another watchdog is running for %s; leaving this pass to it\n", root.Path)
			return nil
		}
		// A service waits its turn instead of failing and being restarted
		// in a loop while, say, a manual --once holds the lock.
		if !waited {
			fmt.Fprintf(o.Diag, "agent-wrap: another watchdog is running for %s; waiting for it to finish\n", root.Path)
		}
		ping()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(lockRetry):
		}
	}
	defer unlock()

	enc := json.NewEncoder(o.Out)
	o.Progress = ping
	o.unrecorded = map[string]bool{}
	pass := func() {
		acts, err := Pass(root, o.Options)
		if err != nil {
			fmt.Fprintf(o.Diag, "agent-wrap: watchdog pass over %s: %v\n", root.Path, err)
		}
		for _, a := range acts {
			enc.Encode(a)
		}
	}
	if o.Once {
		pass()
		return nil
	}

	every := o.Interval
	if wd := sd.WatchdogInterval; wd > 0 && wd < every {
		every = wd // already half of WatchdogSec=, as sd_watchdog_enabled(3) advises
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		pass()
		ping()
		select {
		case <-ctx.Done():
			sd.Notify("STOPPING=1")
			return nil
		case <-t.C:
		}
	}
}
