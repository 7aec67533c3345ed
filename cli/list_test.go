//go:build linux

package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// listJSON is one line of `list --json`.
type listJSON struct {
	RunID       string `json:"run_id"`
	State       string `json:"state"`
	RecordState string `json:"record_state"`
	Outcome     string `json:"outcome"`
	Supervisor  string `json:"supervisor"`
	PID         int    `json:"pid"`
	ExitCode    *int   `json:"exit_code"`
	Cause       string `json:"cause"`
	Reason      string `json:"reason"`
	Error       string `json:"error"`
}

// list says what reconcile would say, in the table and in JSON alike. A run whose wrapper was SIGKILLed and whose job died with it
// is unknown (the record still says running); one whose job lives on is
// running with its supervisor lost; a finished one shows EXIT and an
// unreadable one is the same in both forms.
func TestListShowsVerdict(t *testing.T) {
	root := runtest.NewRoot(t)
	c1, r1 := startRun(t, root, "dead", "dead", "--", "sleep", "300")
	c2, r2 := startRun(t, root, "lost", "lost", "--", "sleep", "300")
	cleanupRun(t, r1, r2)
	rec1 := r1.WaitState(t, statusfile.Running)
	rec2 := r2.WaitState(t, statusfile.Running)
	killWrapper(t, c1, rec1)
	killWrapper(t, c2, rec2)
	if err := unix.Kill(-rec1.PGID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the group to die", func() bool { return len(runtest.Members(rec1.PGID)) == 0 })
	if code, _, errOut := runtest.Exec(t, root, "run", "done", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("run done: exit %d: %s", code, errOut)
	}
	if err := os.Mkdir(filepath.Join(root, "bad"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bad", "status.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runtest.Exec(t, root, "list")
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	for _, re := range []string{
		`(?m)^RUN_ID +STATE +OUTCOME +PID +AGE +LEASE_LEFT +EXIT +CAUSE$`,
		`(?m)^bad +unreadable +unknown +- +- +- +- +-$`,
		`(?m)^dead +lost +unknown +\d+ +\S+ +- +- +-$`,
		`(?m)^done +finished +completed +\d+ +\S+ +- +3 +-$`,
		`(?m)^lost +lost +running \(supervisor lost\) +\d+ +\S+ +- +- +-$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("list lacks a line matching %s:\n%s", re, out)
		}
	}

	code, out, errOut = runtest.Exec(t, root, "list", "--json")
	if code != 0 {
		t.Fatalf("list --json: exit %d: %s", code, errOut)
	}
	rows := map[string]listJSON{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r listJSON
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("list --json line %q: %v", line, err)
		}
		// Every field is always there: null or "" when not known.
		for _, key := range []string{"run_id", "state", "record_state", "outcome", "supervisor", "pid", "created_at", "deadline_epoch", "exit_code", "cause", "reason", "error"} {
			if !strings.Contains(line, `"`+key+`":`) {
				t.Errorf("list --json line lacks %q: %s", key, line)
			}
		}
		rows[r.RunID] = r
	}
	want := map[string]listJSON{
		"bad":  {State: "unreadable", Outcome: "unknown", Supervisor: "none"},
		"dead": {State: "lost", Outcome: "unknown", Supervisor: "lost"},
		"lost": {State: "lost", Outcome: "running", Supervisor: "lost"},
		"done": {State: "finished", Outcome: "completed", Supervisor: "none"},
	}
	for id, w := range want {
		g := rows[id]
		if g.State != w.State || g.Outcome != w.Outcome || g.Supervisor != w.Supervisor {
			t.Errorf("list --json %s: state %q outcome %q supervisor %q; want %q %q %q", id, g.State, g.Outcome, g.Supervisor, w.State, w.Outcome, w.Supervisor)
		}
	}
	// The record's own state is kept beside the judged one.
	for _, id := range []string{"dead", "lost"} {
		if rows[id].RecordState != "running" {
			t.Errorf("list --json %s: record_state %q, want running", id, rows[id].RecordState)
		}
	}
	if rows["bad"].Error == "" || rows["dead"].Reason == "" || rows["done"].ExitCode == nil || *rows["done"].ExitCode != 3 {
		t.Errorf("list --json: bad error %q, dead reason %q, done exit %v", rows["bad"].Error, rows["dead"].Reason, rows["done"].ExitCode)
	}
	// What reconcile says of the same runs.
	wantVerdict(t, root, "dead", 4, "unknown", "lost")
	wantVerdict(t, root, "lost", 3, "running", "lost")
}

// "survivors" is absent while a run is live and a list once it is terminal
// ([] being the promise), never null.
func TestSurvivorsOnlyWhenTerminal(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "sv", "--grace", "1s", "sv", "--", "sleep", "300")
	cleanupRun(t, r)
	r.WaitState(t, statusfile.Running)
	code, out, _ := runtest.Exec(t, root, "status", "--json", "sv")
	if code != 0 || strings.Contains(out, "survivors") {
		t.Errorf("status of a running run: exit %d, mentions survivors:\n%s", code, out)
	}
	if b, _ := os.ReadFile(r.File("status.json")); strings.Contains(string(b), "survivors") {
		t.Errorf("status.json of a running run mentions survivors:\n%s", b)
	}
	if code, out, errOut := runtest.Exec(t, root, "cancel", "sv"); code != 0 {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, errOut)
	}
	c.Wait(t)
	code, out, _ = runtest.Exec(t, root, "status", "--json", "sv")
	if code != 0 || !strings.Contains(out, `"survivors": []`) {
		t.Errorf("status of a cancelled run: exit %d, want \"survivors\": []\n%s", code, out)
	}
}
