package answer

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

func code(n int) *int { return &n }

// The bytes on the wire: every field's name, its place and when it is left
// out, and every outcome's value, exactly as controllers of every version
// read them.
func TestWireBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"cancel/confirmed",
			NewCancel("r1", Confirmed, &statusfile.Record{RunID: "r1", State: statusfile.Cancelled, Cause: statusfile.CauseCancel, ExitCode: code(143), Survivors: []int{}, Containment: statusfile.ContainmentCgroup}),
			`{"run_id":"r1","outcome":"confirmed","state":"cancelled","cause":"cancel","exit_code":143,"survivors":[]}`},
		{"cancel/already finished, survivors not listed",
			NewCancel("r1", Already, &statusfile.Record{RunID: "r1", State: statusfile.Finished, ExitCode: code(0), Containment: statusfile.ContainmentSubreaper}),
			`{"run_id":"r1","outcome":"already","state":"finished","exit_code":0,"survivors":[]}`},
		{"cancel/survivors unknown",
			func() Cancel {
				a := NewCancel("r1", NotConfirmed, &statusfile.Record{RunID: "r1", State: statusfile.Cancelled, Cause: statusfile.CauseLease, ExitCode: code(124), Containment: statusfile.ContainmentSession})
				a.Reason = "cleanup cannot be confirmed"
				return a
			}(),
			`{"run_id":"r1","outcome":"not_confirmed","state":"cancelled","cause":"lease","exit_code":124,"survivors":null,"reason":"cleanup cannot be confirmed"}`},
		{"cancel/survivors",
			NewCancel("r1", NotConfirmed, &statusfile.Record{RunID: "r1", State: statusfile.Cancelled, Cause: statusfile.CauseCancel, ExitCode: code(143), Survivors: []int{77, 78}, Containment: statusfile.ContainmentSession}),
			`{"run_id":"r1","outcome":"not_confirmed","state":"cancelled","cause":"cancel","exit_code":143,"survivors":[77,78]}`},
		{"cancel/refused, running",
			NewCancel("r1", Refused, &statusfile.Record{RunID: "r1", State: statusfile.Running}),
			`{"run_id":"r1","outcome":"refused","state":"running","survivors":[]}`},
		{"cancel/no record",
			NewCancel("r1", NoRecord, nil),
			`{"run_id":"r1","outcome":"no_record","survivors":[]}`},
		{"renew/renewed",
			Renew{RunID: "r1", Renewed: true, State: statusfile.Running, Deadline: 1796232142},
			`{"run_id":"r1","renewed":true,"state":"running","deadline_epoch":1796232142}`},
		{"renew/renewed, journal line missing",
			Renew{RunID: "r1", Renewed: true, State: statusfile.Running, Deadline: 1796232142, Reason: "journal: no space left on device"},
			`{"run_id":"r1","renewed":true,"state":"running","deadline_epoch":1796232142,"reason":"journal: no space left on device"}`},
		{"renew/refused",
			Renew{RunID: "r1", State: statusfile.Finished, Refused: true, Reason: "renewal refused: run r1 is finished"},
			`{"run_id":"r1","renewed":false,"state":"finished","refused":true,"reason":"renewal refused: run r1 is finished"}`},
		{"renew/no run",
			Renew{RunID: "r1", NoRun: true, Reason: "no run r1"},
			`{"run_id":"r1","renewed":false,"no_run":true,"reason":"no run r1"}`},
		{"renew/failed",
			Renew{RunID: "r1", State: statusfile.Running, Reason: "cannot renew: disk full"},
			`{"run_id":"r1","renewed":false,"state":"running","reason":"cannot renew: disk full"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("\n got %s\nwant %s", b, tc.want)
			}
			// And back: the same bytes decode to the same answer.
			back := reflect.New(reflect.TypeOf(tc.v))
			if err := json.Unmarshal(b, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Elem().Interface(), tc.v) {
				t.Errorf("decoded %+v, want %+v", back.Elem().Interface(), tc.v)
			}
		})
	}
}

// Final takes only a Confirmed or Already answer for the run asked about,
// in one of statusfile's terminal states, with an exit code and the
// promise that nothing survived.
func TestCancelFinal(t *testing.T) {
	final := Cancel{RunID: "r1", Outcome: Confirmed, State: statusfile.Cancelled, ExitCode: code(143), Survivors: []int{}}
	if !final.Final("r1") {
		t.Fatalf("Final(%+v) = false", final)
	}
	for _, state := range []string{statusfile.Finished, statusfile.Cancelled, statusfile.LaunchFailed} {
		for _, o := range []Outcome{Confirmed, Already} {
			a := final
			a.State, a.Outcome = state, o
			if !a.Final("r1") {
				t.Errorf("Final(%+v) = false, want true", a)
			}
		}
	}
	for name, change := range map[string]func(*Cancel){
		"another run":               func(a *Cancel) { a.RunID = "r2" },
		"no exit code":              func(a *Cancel) { a.ExitCode = nil },
		"unknown":                   func(a *Cancel) { a.Survivors = nil },
		"survivors":                 func(a *Cancel) { a.Survivors = []int{77} },
		"not_confirmed":             func(a *Cancel) { a.Outcome = NotConfirmed },
		"refused":                   func(a *Cancel) { a.Outcome = Refused },
		"no_record":                 func(a *Cancel) { a.Outcome = NoRecord },
		"an outcome from elsewhere": func(a *Cancel) { a.Outcome = "ok" },
		"running":                   func(a *Cancel) { a.State = statusfile.Running },
		"cancelling":                func(a *Cancel) { a.State = statusfile.Cancelling },
		"starting":                  func(a *Cancel) { a.State = statusfile.Starting },
		"no state":                  func(a *Cancel) { a.State = "" },
	} {
		a := final
		change(&a)
		if a.Final("r1") {
			t.Errorf("%s: Final(%+v) = true, want false", name, a)
		}
	}
}

// ParseCancel takes one object with space around it, never the plain line.
func TestParseCancel(t *testing.T) {
	a, err := ParseCancel("  {\"run_id\":\"r1\",\"outcome\":\"already\",\"state\":\"finished\",\"exit_code\":3,\"survivors\":[]}\n")
	if err != nil || a.RunID != "r1" || a.Outcome != Already || a.State != statusfile.Finished || a.ExitCode == nil || *a.ExitCode != 3 {
		t.Errorf("ParseCancel = %+v, %v", a, err)
	}
	if _, err := ParseCancel("r1: cancelled (cause cancel), exit code 143, survivors []"); err == nil {
		t.Error("ParseCancel took the plain line")
	}
}

// ParseRenew keeps each line naming a run and skips the rest: a host
// without renew --json says nothing it could take.
func TestParseRenew(t *testing.T) {
	out := `{"run_id":"a","renewed":true,"state":"running","deadline_epoch":5}
agent-wrap: unknown flag: --json
{"renewed":true}

{"run_id":"b","renewed":false,"state":"finished","refused":true,"reason":"over"}` + "\r\n"
	got := ParseRenew([]byte(out))
	want := map[string]Renew{
		"a": {RunID: "a", Renewed: true, State: statusfile.Running, Deadline: 5},
		"b": {RunID: "b", State: statusfile.Finished, Refused: true, Reason: "over"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseRenew:\n got %+v\nwant %+v", got, want)
	}
	if got := ParseRenew([]byte("usage: agent-wrap renew [--lease D] RUN_ID\n")); len(got) != 0 {
		t.Errorf("ParseRenew of a usage line = %+v, want none", got)
	}
}
