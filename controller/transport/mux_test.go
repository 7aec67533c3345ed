package controller

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestNextTickSharedInstants(t *testing.T) {
	every := 2 * time.Second
	for _, now := range []time.Time{time.Unix(100, 0), time.Unix(100, 1), time.Unix(101, 999_999_999)} {
		d := nextTick(now, every)
		at := now.Add(d)
		if d <= 0 || d > every || at.UnixNano()%int64(every) != 0 {
			t.Errorf("nextTick(%v, %v) = %v: at %v, want a multiple of %v within one period", now, every, d, at, every)
		}
	}
}

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

func TestBackoffFirstRetryAtOnce(t *testing.T) {
	var b backoff
	t0 := time.Now()
	b.wait(context.Background())
	if d := time.Since(t0); d > 50*time.Millisecond {
		t.Errorf("first wait took %v, want at once", d)
	}
	t0 = time.Now()
	b.wait(context.Background())
	if d := time.Since(t0); d < backoffMin {
		t.Errorf("second wait took %v, want at least %v", d, backoffMin)
	}
	b.reset()
	t0 = time.Now()
	b.wait(context.Background())
	if d := time.Since(t0); d > 50*time.Millisecond {
		t.Errorf("first wait after reset took %v, want at once", d)
	}
}

func TestMuxStandsAside(t *testing.T) {
	for _, rsh := range [][]string{
		{"ssh", "-o", "ControlPath=/x/%C"},
		{"ssh", "-S", "/x/sock"},
		{"ssh", "-M"},
		{"ssh", "-oControlMaster=auto"},
	} {
		if !setsControl(append(rsh, "-F", "/dev/null"), "h") {
			t.Errorf("setsControl(%q) = false, want true", rsh)
		}
	}
	if setsControl([]string{"ssh", "-F", "/dev/null", "-p", "22"}, "h") {
		t.Error("setsControl with no ControlPath = true")
	}
	if !setsJump([]string{"ssh", "-J", "bastion"}) || !setsJump([]string{"ssh", "-o", "ProxyJump=b"}) || setsJump([]string{"ssh", "-p", "2"}) {
		t.Error("setsJump misjudged")
	}
}

// TestLearnCapRefusedTogether: a master with 4 sessions open on a host
// whose MaxSessions is 4, and two more calls refused by it at the same
// moment, both still holding their tickets when the first counts. The
// first may count the second; the second, counting after the first let
// its ticket go, brings the cap to 4. A count made when the cap was lower
// does not raise it.
func TestLearnCapRefusedTogether(t *testing.T) {
	m := &mux{base: filepath.Join(t.TempDir(), "h"), full: map[int]time.Time{}}
	var open []*ticket
	for i := 0; i < 4; i++ {
		open = append(open, m.takeTicket(0, true))
	}
	a, b := m.takeTicket(0, true), m.takeTicket(0, true)
	if a == nil || b == nil || open[3] == nil {
		t.Fatal("tickets not taken")
	}
	m.learnCap(a)
	if a.f != nil {
		t.Error("learnCap did not let the refused ticket go")
	}
	m.learnCap(b)
	if got := m.sessionCap(0); got != 4 {
		t.Errorf("two calls refused together: cap %d, want 4 (the sessions open)", got)
	}
	os.WriteFile(m.sock(0)+".cap", []byte("3\n"), 0o600)
	open[2].release()
	c := m.takeTicket(0, false) // ticket 2, kept for short calls; 0, 1 and 3 held beside it
	if c == nil {
		t.Fatal("the short call's ticket not taken")
	}
	m.learnCap(c)
	if got := m.sessionCap(0); got != 3 {
		t.Errorf("a refusal counting 3 beside a cap of 3: cap %d, want 3", got)
	}
	for _, o := range open {
		o.release()
	}
}
