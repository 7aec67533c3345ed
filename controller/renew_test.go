package controller

import (
	"testing"
	"time"
)

// A renewal is given more than a short period while the lease has time for
// it, never more than half of what the lease has left, and never less than
// its period.
func TestRenewTimeout(t *testing.T) {
	for _, c := range []struct {
		lease, every, since, nested, giveUp, want time.Duration
	}{
		{20 * time.Second, 2 * time.Second, 2 * time.Second, 0, 0, 9 * time.Second},              // half the 18 s left
		{120 * time.Second, 2 * time.Second, 2 * time.Second, 0, 0, renewFloor},                  // the floor, not 59 s
		{5 * time.Minute, 100 * time.Second, 100 * time.Second, 0, 0, 100 * time.Second},         // the period is longer
		{20 * time.Second, 2 * time.Second, 18 * time.Second, 0, 0, 2 * time.Second},             // 1 s would be half: the period
		{2 * time.Minute, 2 * time.Second, 2 * time.Second, 8 * time.Second, 0, 3 * time.Second}, // a nested run's capped lease
		{2 * time.Minute, time.Second, time.Second, 0, 8 * time.Second, 3500 * time.Millisecond}, // --give-up 8s is nearer
	} {
		r := &Run{cfg: Config{Lease: c.lease, RenewEvery: c.every, GiveUp: c.giveUp}}
		r.lastRenew.Store(time.Now().Add(-c.since).UnixNano())
		got := r.renewTimeout(c.nested)
		if d := got - c.want; d < -50*time.Millisecond || d > 50*time.Millisecond {
			t.Errorf("lease %v, every %v, %v since the last renewal, nested %v, give-up %v: renewTimeout %v, want %v", c.lease, c.every, c.since, c.nested, c.giveUp, got, c.want)
		}
	}
}
