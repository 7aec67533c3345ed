//go:build linux

package cli

import (
	"encoding/json"
	"errors"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

func init() {
	register(&command{
		name:     "watchdog",
		summary:  "stop runs whose lease passed while no wrapper enforced it",
		synopsis: "watchdog [--once] [--interval D] [--grace D]",
		help: `One watchdog per run root (it holds a lock). Each pass stops every run whose
deadline has passed and whose wrapper is dead or has not acted within a few
seconds, and prints one JSON line per action. cron runs --once; systemd runs
the loop ('agent-wrap install' sets either up).`,
		exits: "0; 1 the run root could not be watched (another watchdog holds it, or it is unreadable); 64 usage; 78 unsafe run root",
		run:   runWatchdog,
	})
}

// runWatchdog holds the root's watchdog lock (one instance per root) and
// makes a pass over every run, once (cron) or every --interval (systemd,
// with READY and WATCHDOG notifications when NOTIFY_SOCKET is set). Each
// action is one JSON line on stdout.
func runWatchdog(e *Env, args []string) int {
	fs := e.flags("watchdog")
	once := fs.Bool("once", false, "make one pass and exit (for cron)")
	interval := durationValue(5 * time.Second)
	fs.Var(&interval, "interval", "time `D` between passes when not --once")
	var grace durationValue
	fs.Var(&grace, "grace", "time `D` between TERM and KILL (default: each run's own grace)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return e.usageError("watchdog takes no arguments")
	}
	if !*once && interval <= 0 {
		return e.usageError("--interval must be positive")
	}
	root, code := e.openRoot(true)
	if root == nil {
		return code
	}
	defer root.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)
	sd := watchdog.EnvNotifier()
	ping := func() { sd.Notify("WATCHDOG=1") }
	if !*once {
		sd.Notify("READY=1")
	}
	var unlock func()
	for waited := false; ; waited = true {
		var err error
		unlock, err = root.TryLock(watchdog.LockFile)
		if err == nil {
			break
		}
		if !errors.Is(err, rundir.ErrLocked) {
			e.errorf("%v", err)
			return ExitFailure
		}
		if *once {
			// Overlapping cron passes are normal: the other one does the work.
			e.errorf("another watchdog is running for %s; leaving this pass to it", root.Path)
			return ExitOK
		}
		// A service waits its turn instead of failing and being restarted
		// in a loop while, say, a manual --once holds the lock.
		if !waited {
			e.errorf("another watchdog is running for %s; waiting for it to finish", root.Path)
		}
		ping()
		select {
		case <-sigs:
			return ExitOK
		case <-e.Ctx.Done():
			return ExitOK
		case <-time.After(time.Second):
		}
	}
	defer unlock()

	enc := json.NewEncoder(e.Stdout)
	pass := func() {
		acts, err := watchdog.Pass(root, watchdog.Options{Grace: time.Duration(grace), Progress: ping, Diag: e.Stderr})
		if err != nil {
			e.errorf("watchdog pass over %s: %v", root.Path, err)
		}
		for _, a := range acts {
			enc.Encode(a)
		}
	}
	if *once {
		pass()
		return ExitOK
	}

	every := time.Duration(interval)
	if wd := sd.WatchdogInterval; wd > 0 && wd < every {
		every = wd // already half of WatchdogSec=, as sd_watchdog_enabled(3) advises
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		pass()
		ping()
		select {
		case <-sigs:
			sd.Notify("STOPPING=1")
			return ExitOK
		case <-e.Ctx.Done():
			return ExitOK
		case <-t.C:
		}
	}
}
