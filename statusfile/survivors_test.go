package statusfile

import (
	"strings"
	"testing"
)

// "survivors" is absent until the record is terminal, and then always a
// list, even when the writer left it nil (never null, which would read as
// "unknown"); Parse reads each form back as Marshal writes it.
func TestSurvivorsForm(t *testing.T) {
	for _, tc := range []struct {
		state     string
		survivors []int
		want      string // "" means absent
	}{
		{Starting, nil, ""},
		{Running, nil, ""},
		{Cancelling, []int{}, ""},
		{Finished, nil, `"survivors": []`},
		{Cancelled, []int{}, `"survivors": []`},
		{Cancelled, []int{41, 42}, `"survivors": [`},
		{LaunchFailed, nil, `"survivors": []`},
	} {
		rec := &Record{Schema: Schema, RunID: "s1", State: tc.state, Survivors: tc.survivors}
		if Terminal(tc.state) {
			rec.SetExit(1)
		}
		b, err := Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		got := string(b)
		switch {
		case tc.want == "" && strings.Contains(got, "survivors"):
			t.Errorf("%s: survivors written for a live record:\n%s", tc.state, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: want %s in\n%s", tc.state, tc.want, got)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.state, err)
		}
		if Terminal(tc.state) != (back.Survivors != nil) {
			t.Errorf("%s: parsed survivors %#v", tc.state, back.Survivors)
		}
	}
}

// A final record under containment session that saw no survivor cannot
// promise that none is left: survivors is null, and read back as unknown.
// Survivors it did see are listed; under cgroup or subreaper, none seen
// is the promise [].
func TestSurvivorsUnknownUnderSession(t *testing.T) {
	for _, tc := range []struct {
		containment string
		survivors   []int
		want        string
		unknown     bool
	}{
		{ContainmentSession, nil, `"survivors": null`, true},
		{ContainmentSession, []int{}, `"survivors": null`, true},
		{ContainmentSession, []int{41}, `"survivors": [`, false},
		{ContainmentCgroup, nil, `"survivors": []`, false},
		{ContainmentSubreaper, nil, `"survivors": []`, false},
		{"", nil, `"survivors": []`, false},
	} {
		rec := &Record{Schema: Schema, RunID: "s1", State: Cancelled, Containment: tc.containment, Survivors: tc.survivors}
		rec.SetExit(143)
		b, err := Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), tc.want) {
			t.Errorf("%q %v: want %s in\n%s", tc.containment, tc.survivors, tc.want, b)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if back.SurvivorsUnknown() != tc.unknown || (back.Survivors == nil) != tc.unknown {
			t.Errorf("%q %v: read back survivors %#v, unknown %v; want unknown %v", tc.containment, tc.survivors, back.Survivors, back.SurvivorsUnknown(), tc.unknown)
		}
	}
}
