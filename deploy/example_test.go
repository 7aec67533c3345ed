package deploy_test

import (
	"context"
	"time"

	"github.com/agent-wrap/agent-wrap/deploy"
)

// The watchdog loop that agent-wrap-watchdog.service (Type=notify,
// WatchdogSec=30s) expects: READY=1 once the first pass is done, then
// WATCHDOG=1 after every pass, passes at least twice per WatchdogSec.
// Outside systemd, Notify does nothing.
func ExampleNotify() {
	ctx := context.Background()
	pass := func(context.Context) {} // one watchdog pass over the run root

	interval := 5 * time.Second // --interval
	if wd := deploy.WatchdogInterval(); wd > 0 && wd < interval {
		interval = wd
	}
	pass(ctx)
	_, _ = deploy.Notify("READY=1")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_, _ = deploy.Notify("STOPPING=1")
			return
		case <-t.C:
			pass(ctx)
			_, _ = deploy.Notify("WATCHDOG=1")
		}
	}
}
