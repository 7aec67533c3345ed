package controller

import "testing"

// parseFinal takes only a confirmed (or already) terminal record of the
// run asked about with no survivors: the cases the English line had, as
// cancel --json's object.
func TestParseFinal(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want finalWord
		ok   bool
	}{
		{`{"run_id":"r1","outcome":"confirmed","state":"cancelled","cause":"cancel","exit_code":143,"survivors":[]}` + "\n", finalWord{"cancelled", "cancel", 143}, true},
		{`{"run_id":"r1","outcome":"already","state":"finished","exit_code":0,"survivors":[]}`, finalWord{"finished", "", 0}, true},
		{`{"run_id":"r1","outcome":"already","state":"cancelled","cause":"signal:TERM","exit_code":143,"survivors":[]}`, finalWord{"cancelled", "signal:TERM", 143}, true},
		{`{"run_id":"r1","outcome":"confirmed","state":"launch_failed","exit_code":127,"survivors":[]}`, finalWord{"launch_failed", "", 127}, true},
		// Survivors, another run, a state not terminal, no code, not confirmed.
		{`{"run_id":"r1","outcome":"not_confirmed","state":"cancelled","cause":"cancel","exit_code":143,"survivors":[77],"reason":"cleanup not confirmed: [77] outlived KILL"}`, finalWord{}, false},
		{`{"run_id":"r1","outcome":"confirmed","state":"cancelled","cause":"cancel","exit_code":143,"survivors":[77]}`, finalWord{}, false},
		{`{"run_id":"r2","outcome":"confirmed","state":"cancelled","cause":"cancel","exit_code":143,"survivors":[]}`, finalWord{}, false},
		{`{"run_id":"r1","outcome":"not_confirmed","state":"running","survivors":[],"reason":"the record is running, not terminal"}`, finalWord{}, false},
		{`{"run_id":"r1","outcome":"confirmed","state":"running","exit_code":0,"survivors":[]}`, finalWord{}, false},
		{`{"run_id":"r1","outcome":"confirmed","state":"finished","survivors":[]}`, finalWord{}, false},
		{`{"run_id":"r1","outcome":"confirmed","state":"finished","exit_code":0}`, finalWord{}, false},
		{`{"run_id":"r1","outcome":"refused","state":"running","survivors":[],"reason":"refusing to signal"}`, finalWord{}, false},
		// The English line is not read at all.
		{"r1: cancelled (cause cancel), exit code 143, survivors []", finalWord{}, false},
		{"garbage", finalWord{}, false},
	} {
		got, ok := parseFinal("r1", tc.out)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseFinal(%q) = %+v, %v; want %+v, %v", tc.out, got, ok, tc.want, tc.ok)
		}
	}
}
