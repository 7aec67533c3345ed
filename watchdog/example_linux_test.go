package watchdog_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

// The watchdog service that agent-wrap-watchdog.service (Type=notify,
// WatchdogSec=30s) runs: a pass every 5 s, READY=1 and WATCHDOG=1 to the
// service manager named in the environment (nothing outside systemd),
// until TERM or INT.
func ExampleServe() {
	root, err := rundir.OpenRoot(os.ExpandEnv("$HOME/.agent-runs"), true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer root.Close()
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	o := watchdog.ServeOptions{Interval: 5 * time.Second, Out: os.Stdout, Options: watchdog.Options{Diag: os.Stderr}}
	if err := watchdog.Serve(ctx, root, o, watchdog.EnvNotifier()); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}
