//go:build linux

package cli

import (
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/watchdog"
)

func init() {
	register(&command{
		name:     "watchdog",
		summary:  "stop runs whose lease passed while no wrapper enforced it",
		synopsis: "watchdog [--once] [--interval D] [--grace D]",
		help: `One watchdog per run root (it holds a lock; one that is stopped, or has not
touched it for 30s, is passed over). Each pass stops every run whose deadline
has passed and whose wrapper is dead or has not acted within a few seconds,
and every run left cancelling past its grace + 3s by a stuck or killed
wrapper or cancel, side by side, without the run's lock when a stopped
process holds it; it prints one JSON line per action. cron runs --once;
systemd runs the loop ('agent-wrap install' sets either up).`,
		exits: "0; 1 the run root could not be watched (another watchdog holds it, or it is unreadable); 64 usage; 78 unsafe run root",
		run:   runWatchdog,
	})
}

// runWatchdog parses the flags, opens the root and serves it (watchdog.Serve:
// the lock, the passes, the notifications to systemd) until TERM or INT.
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
	// TERM and INT end the service (and are held off during a --once pass).
	ctx, stop := signal.NotifyContext(e.Ctx, unix.SIGTERM, unix.SIGINT)
	defer stop()
	o := watchdog.ServeOptions{
		Options:  watchdog.Options{Grace: time.Duration(grace), Diag: e.Stderr},
		Once:     *once,
		Interval: time.Duration(interval),
		Out:      e.Stdout,
	}
	if err := watchdog.Serve(ctx, root, o, watchdog.EnvNotifier()); err != nil {
		e.errorf("%v", err)
		return ExitFailure
	}
	return ExitOK
}
