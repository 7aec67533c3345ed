package transport

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestNextTickSharedInstants(t *testing.T) {
	every := 2 * time.Second
	for _, now := range []time.Time{time.Unix(100, 0), time.Unix(100, 1), time.Unix(101, 999_999_999)} {
		d := NextTick(now, every)
		at := now.Add(d)
		if d <= 0 || d > every || at.UnixNano()%int64(every) != 0 {
			t.Errorf("NextTick(%v, %v) = %v: at %v, want a multiple of %v within one period", now, every, d, at, every)
		}
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
