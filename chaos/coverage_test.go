package chaos

import (
	"strings"
	"testing"
)

// TestCoverageSaysWhatWasNotHit: the table counts each fault × phase, the
// totals add up, and the pairs never hit are named, until none is left.
func TestCoverageSaysWhatWasNotHit(t *testing.T) {
	c := NewCoverage()
	c.Run()
	c.Hit("kill-wrapper", "grace")
	c.Hit("kill-wrapper", "grace")
	c.Miss("ro")
	if got := c.Count("kill-wrapper", "grace"); got != 2 {
		t.Fatalf("kill-wrapper grace counted %d, want 2", got)
	}
	if runs, faults := c.Totals(); runs != 1 || faults != 2 {
		t.Fatalf("totals %d runs %d faults, want 1 and 2", runs, faults)
	}
	un := c.Unhit()
	if len(un) != len(Faults)*len(Phases)-1 {
		t.Fatalf("%d pairs not hit, want all but one", len(un))
	}
	if s := c.String(); !strings.Contains(s, "not hit (") || !strings.Contains(s, "ro claim") {
		t.Fatalf("the table does not name what was not hit:\n%s", s)
	}
	all := NewCoverage()
	all.Add(c)
	for _, f := range Faults {
		for _, p := range Phases {
			all.Hit(f, p)
		}
	}
	if len(all.Unhit()) != 0 || !strings.Contains(all.String(), "every fault × phase was hit") {
		t.Fatalf("every pair hit, but:\n%s", all)
	}
	if all.Count("kill-wrapper", "grace") != 3 {
		t.Fatalf("Add lost counts:\n%s", all)
	}
}
