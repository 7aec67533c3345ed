package cli

import (
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/exitcode"
)

// codes reads "1-123", "128+N" or "129, 130, 143" as exitcode's rows do,
// and says whether it is a range (the job's codes) rather than codes
// agent-wrap chooses.
func codes(s string) ([]int, bool) {
	r := exitcode.Row{Codes: strings.ReplaceAll(s, ", ", " / ")}
	return r.Numbers(), strings.ContainsAny(s, "-+")
}

// The man page's EXIT STATUS list and exitcode's table agree: every code
// the list explains is one of the table's, and every code the table names
// one by one (not as a range of the job's codes) has its own entry.
func TestManExitStatusIsTable(t *testing.T) {
	known, chosen := map[int]bool{}, map[int]string{}
	for _, r := range append(append([]exitcode.Row{}, exitcode.Table...), exitcode.SSH...) {
		ns, isRange := codes(r.Codes)
		for _, n := range ns {
			known[n] = true
			if !isRange {
				chosen[n] = r.From
			}
		}
	}
	explained := map[int]bool{}
	for _, x := range exitStatus {
		ns, isRange := codes(x.code)
		for _, n := range ns {
			if !known[n] {
				t.Errorf("the man page explains exit code %d (%q), which exitcode's table does not have", n, x.code)
			}
			if !isRange {
				explained[n] = true
			}
		}
	}
	for n, from := range chosen {
		if !explained[n] {
			t.Errorf("exit code %d (%s) is in exitcode's table but has no entry on the man page's EXIT STATUS list", n, from)
		}
	}
}
