package chaos

import (
	"testing"
	"time"
)

// TestWatchdogDownSince: the lease bound is stretched by the time the
// harness kept the watchdog stopped or dead after the deadline, and only
// that, up to now: a span that began before the deadline counts from it, an
// open or unfinished one up to now.
func TestWatchdogDownSince(t *testing.T) {
	now := time.Now()
	deadline := now.Add(-5 * time.Second)
	w := &watchdog{down: []span{
		{from: now.Add(-20 * time.Second), to: now.Add(-18 * time.Second)}, // before the deadline: nothing
		{from: now.Add(-6 * time.Second), to: now.Add(-3 * time.Second)},   // straddles it: 2s
	}}
	near := func(got, want time.Duration) bool { return got > want-10*time.Millisecond && got < want+time.Second }
	if got := w.downSince(deadline); !near(got, 2*time.Second) {
		t.Fatalf("downSince = %v, want 2s", got)
	}
	// Stopped for a pause that has not ended: counted up to now.
	w.down = append(w.down, span{from: now.Add(-1 * time.Second), to: now.Add(10 * time.Second)})
	if got := w.downSince(deadline); !near(got, 3*time.Second) {
		t.Fatalf("with a stop not over yet: downSince = %v, want about 3s", got)
	}
	// Killed and not restarted yet: an open span, counted up to now.
	w.down = []span{{from: now.Add(-2 * time.Second)}}
	if got := w.downSince(deadline); !near(got, 2*time.Second) {
		t.Fatalf("with an open span: downSince = %v, want about 2s", got)
	}
}

// TestPhaseOf: the phase a fault is counted in, from the state seen and
// the deadline the harness knows.
func TestPhaseOf(t *testing.T) {
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	for _, c := range []struct {
		state    string
		deadline time.Time
		want     string
	}{
		{"", time.Time{}, "claim"},
		{"starting", future, "start"},
		{"running", future, "running"},
		{"running", time.Time{}, "running"},
		{"running", past, "grace"},
		{"cancelling", future, "grace"},
		{"finished", future, "final"},
		{"cancelled", past, "final"},
		{"launch_failed", future, "final"},
	} {
		if got := phaseOf(c.state, c.deadline); got != c.want {
			t.Errorf("phaseOf(%q, deadline in %v) = %s, want %s", c.state, time.Until(c.deadline).Round(time.Second), got, c.want)
		}
	}
}
