package e2e

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
)

// cancelObject reads cancel --json's stdout: exactly one JSON object on one
// line, returned with its keys.
func cancelObject(t *testing.T, out string) map[string]any {
	t.Helper()
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "}\n") {
		t.Fatalf("cancel --json printed %q, want one JSON object on one line", out)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("cancel --json printed %q: %v", out, err)
	}
	return m
}

func keys(m map[string]any) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// cancel --json over a second connection, while the first streams: one
// object with run_id, outcome, state, cause, exit_code and survivors, exit
// 0; a second cancel says already, with the same final record.
func TestCancelJSONOverSSH(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "cancel-json"
	s, r, _ := h.startTree(id)

	c := h.ssh("cancel", "--json", "--wait", "20s", id)
	if c.code != 0 {
		t.Fatalf("cancel --json: exit %d, want 0\nstdout: %s\nstderr: %s", c.code, c.stdout, c.stderr)
	}
	want := map[string]any{"run_id": id, "outcome": "confirmed", "state": "cancelled", "cause": "cancel", "exit_code": 143.0, "survivors": []any{}}
	if got := cancelObject(t, c.stdout); !reflect.DeepEqual(got, want) {
		t.Errorf("cancel --json: %v (keys %v), want %v", got, keys(got), want)
	}
	if code := s.wait(t); code != 143 {
		t.Errorf("the streaming connection ended with %d, want 143", code)
	}
	waitGroupEmpty(t, r.PGID)

	again := h.ssh("cancel", "--json", id)
	want["outcome"] = "already"
	if got := cancelObject(t, again.stdout); again.code != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("cancel --json again: exit %d, %v; want exit 0, %v", again.code, got, want)
	}
	// The plain form still prints its line.
	plain := h.ssh("cancel", id)
	if wantLine := id + ": already cancelled (cause cancel), exit code 143, survivors []\n"; plain.code != 0 || plain.stdout != wantLine {
		t.Errorf("plain cancel: exit %d, %q; want 0, %q", plain.code, plain.stdout, wantLine)
	}
}

// The controller cancels with cancel --json and reads its object: the
// cancel_confirmed event carries it, and the ledger settles the run with
// the object's state, cause and code.
func TestControllerReadsCancelJSON(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	const id = "ctl-cancel-json"
	k := c.start(id, longLease, sleepTree...)
	runtest.Eventually(t, "the job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	r := c.waitRunning(id)
	waitMembers(t, r.PGID, 3)
	k.signal(t, syscall.SIGTERM)
	if code := k.wait(t); code != 143 {
		t.Errorf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	ev := c.lastEvent(id, "cancel_confirmed")
	line, _ := ev["record"].(string)
	if line == "" {
		t.Fatalf("no cancel_confirmed event with a record: %v", ev)
	}
	got := cancelObject(t, line+"\n")
	if got["run_id"] != id || got["outcome"] != "confirmed" || got["state"] != "cancelled" || got["cause"] != "cancel" || got["exit_code"] != 143.0 || !reflect.DeepEqual(got["survivors"], []any{}) {
		t.Errorf("cancel_confirmed's record: %v", got)
	}
	c.treeGone(id)
	c.wantSettled(id, "cancelled", "cancel", 143)
}
