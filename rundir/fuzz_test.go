package rundir_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/rundir"
)

var idRE = regexp.MustCompile(rundir.IDPattern)

// FuzzValidID: ValidID never panics, and whatever it accepts matches
// IDPattern, is at most 128 bytes, names no path (no '/', no NUL, not "." or
// "..") and cannot be read as a flag or a hidden file (no leading '-' or
// '.'). What it refuses wraps ErrBadID.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{"build-1", "a", "A.b_c-d", "", ".", "..", "../x", "a/b", "-rf", ".hidden", "a\x00b", "a\nb", "a\n", "é", strings.Repeat("a", 128), strings.Repeat("a", 129), "run.", "x..y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := rundir.ValidID(id)
		if err != nil {
			if !errors.Is(err, rundir.ErrBadID) {
				t.Fatalf("ValidID(%q) = %v, which does not wrap ErrBadID", id, err)
			}
			return
		}
		switch {
		case !idRE.MatchString(id):
			t.Fatalf("ValidID accepted %q, which does not match %s", id, rundir.IDPattern)
		case len(id) == 0 || len(id) > 128:
			t.Fatalf("ValidID accepted %q: %d bytes", id, len(id))
		case strings.ContainsAny(id, "/\x00\n"):
			t.Fatalf("ValidID accepted %q, which contains a slash, NUL or newline", id)
		case id == "." || id == "..":
			t.Fatalf("ValidID accepted %q", id)
		case id[0] == '.' || id[0] == '-':
			t.Fatalf("ValidID accepted %q, which starts with %q", id, id[0])
		}
	})
}
