package controller

import (
	"context"
	"testing"
	"time"
)

// TestGiveUpFollowsRenewals: withGiveUp's context ends once --give-up has
// passed since the last renewal, and a renewal before that moves the end:
// never earlier than the last renewal plus --give-up (the timer sleeps to
// that time and looks again; it is not a fixed tick).
func TestGiveUpFollowsRenewals(t *testing.T) {
	t.Parallel()
	const giveUp = 2 * time.Second
	r := &Run{cfg: Config{GiveUp: giveUp, Lease: time.Minute}}
	first := time.Now()
	r.lastRenew.Store(first.UnixNano())
	ctx, cancel := r.withGiveUp(context.Background())
	defer cancel()

	// A renewal well before the give-up (the first timer is set for the
	// first one). On a machine so loaded that the sleep outlasted the
	// give-up, what can still be checked is that it did not end early.
	time.Sleep(giveUp / 4)
	renewed := time.Now()
	if ctx.Err() != nil {
		if since := time.Since(first); since < giveUp {
			t.Fatalf("the give-up ended the call %v after the last renewal; --give-up is %v", since, giveUp)
		}
		t.Logf("the machine held this test past the give-up before the renewal; checked only that it did not end early")
		return
	}
	r.lastRenew.Store(renewed.UnixNano())

	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the give-up had not ended the call 30 s after the last renewal")
	}
	if early := renewed.Add(giveUp).Sub(time.Now()); early > 0 {
		t.Fatalf("the give-up ended the call %v before the last renewal plus --give-up", early)
	}
}
