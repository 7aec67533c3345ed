package watchdog_test

import (
	"context"
	"time"

	"github.com/agent-wrap/agent-wrap/watchdog"
)

// The watchdog loop that agent-wrap-watchdog.service (Type=notify,
// WatchdogSec=30s) expects: READY=1 once the first pass is done, then
// WATCHDOG=1 after every pass, passes at least twice per WatchdogSec.
// Outside systemd, Notify does nothing.
func ExampleNotifier() {
	ctx := context.Background()
	pass := func(context.Context) {} // one watchdog pass over the run root

	sd := watchdog.EnvNotifier()
	interval := 5 * time.Second // --interval
	if wd := sd.WatchdogInterval; wd > 0 && wd < interval {
		interval = wd
	}
	pass(ctx)
	_, _ = sd.Notify("READY=1")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_, _ = sd.Notify("STOPPING=1")
			return
		case <-t.C:
			pass(ctx)
			_, _ = sd.Notify("WATCHDOG=1")
		}
	}
}
