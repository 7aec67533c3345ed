package lease_test

import (
	"regexp"
	"testing"

	"github.com/agent-wrap/agent-wrap/lease"
)

var deadlineRE = regexp.MustCompile(`^[0-9]{1,19}\n?$`)

// FuzzParseDeadline feeds ParseDeadline arbitrary bytes (seeds under
// testdata/fuzz/FuzzParseDeadline: real files, torn and foreign ones). It
// must never panic; it may accept only decimal digits and one trailing
// newline, never a negative deadline, and what FormatDeadline writes must
// read back as the same value.
func FuzzParseDeadline(f *testing.F) {
	for _, s := range []string{"1767225600\n", "0\n", "", "\n", "-1\n", "+5\n", " 5\n", "5\n\n", "9223372036854775807\n", "9223372036854775808\n", "99999999999999999999\n", "1e9\n", "0x10\n", "１２\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := lease.ParseDeadline(b)
		if err != nil {
			if v != 0 {
				t.Fatalf("ParseDeadline(%q) = %d with error %v", b, v, err)
			}
			return
		}
		if !deadlineRE.Match(b) {
			t.Fatalf("ParseDeadline accepted %q, which is not decimal seconds and a newline", b)
		}
		if v < 0 {
			t.Fatalf("ParseDeadline(%q) = %d, negative", b, v)
		}
		w, err := lease.ParseDeadline(lease.FormatDeadline(v))
		if err != nil || w != v {
			t.Fatalf("FormatDeadline(%d) reads back as %d, %v", v, w, err)
		}
	})
}
