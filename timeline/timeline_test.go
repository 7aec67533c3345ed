package timeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
)

// chain writes a hash-chained journal of the given events (name, then
// fields), 10 ms apart.
func chain(t *testing.T, events ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	prev := ""
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for i := 0; i < len(events); i += 2 {
		seq := i/2 + 1
		m := map[string]any{}
		if events[i+1] != nil {
			for k, v := range events[i+1].(map[string]any) {
				m[k] = v
			}
		}
		m["seq"], m["at"], m["mono_ns"], m["event"], m["prev"] = seq, t0.Add(time.Duration(seq-1)*10*time.Millisecond).Format(time.RFC3339Nano), int64(1e9+(seq-1)*10e6), events[i], prev
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
		prev = journal.Hash(b)
	}
	return buf.Bytes()
}

type F = map[string]any

// Actions are counted per channel between two other events, and never
// across one: an action after the intent is its own line after it.
func TestActionsGroupedNotAcrossTheIntent(t *testing.T) {
	raw := chain(t,
		"created", F{"lease_seconds": 300, "grace_seconds": 5},
		"started", F{"pid": 10, "pgid": 10, "sid": 10},
		"action", F{"channel": "ssh-agent", "request": "identities", "decision": "accepted", "reason": "running"},
		"lease_renewed", F{"deadline_epoch": 1796299765, "lease_seconds": 300},
		"action", F{"channel": "ssh-agent", "request": "sign", "decision": "accepted", "reason": "running"},
		"action", F{"channel": "http:gh", "decision": "accepted", "reason": "running"},
		"action_end", F{"action": 6, "status": 200, "cut": false},
		"action", F{"channel": "ssh-agent", "request": "sign", "decision": "accepted", "reason": "running"},
		"lease_renewed", F{"deadline_epoch": 1796299865, "lease_seconds": 300},
		"cancel_requested", F{"by": "wrapper", "cause": "signal:TERM"},
		"action", F{"channel": "ssh-agent", "request": "sign", "decision": "refused", "reason": "intent_recorded"},
		"authority_revoked", F{"channel": "ssh-agent"},
		"gateway_frobbed", F{"widget": "x", "n": 3},
		"final", F{"state": "cancelled", "cause": "signal:TERM", "exit_code": 143, "survivors": []any{}},
	)
	items, v := Build(raw)
	if !v.Intact || v.Lines != 14 {
		t.Fatalf("verify: %+v", v)
	}
	var got []string
	for _, it := range items {
		got = append(got, fmt.Sprintf("%d/%d %s %s: %s", it.Seq, it.Count, it.Actor, it.Event, it.Text))
	}
	want := []string{
		"1/1 wrapper created: created: lease 5m, grace 5s",
		"2/1 wrapper started: started: pid 10 (pgid 10, sid 10)",
		"3/3 gateway action: ssh-agent: 3 requests (sign×2, identities), 3 accepted",
		"4/2 renew lease_renewed: lease renewed 2 times, deadline 2026-12-03 12:11:05Z (lease 5m)",
		"6/1 gateway action: http:gh: 1 request, 1 accepted",
		"7/1 gateway action_end: http:gh: 1 request ended (status 200)",
		"10/1 wrapper cancel_requested: INTENT cancel requested: cause signal:TERM",
		"11/1 gateway action: ssh-agent: 1 request (sign), 0 accepted, 1 refused (intent_recorded)",
		"12/1 wrapper authority_revoked: authority revoked: ssh-agent",
		"13/1 wrapper gateway_frobbed: gateway frobbed: n=3 widget=x",
		"14/1 wrapper final: final: cancelled (signal:TERM), exit 143, nothing survived",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if items[2].LastSeq != 8 || items[2].MS != 20 || items[2].LastMS != 70 {
		t.Errorf("ssh-agent summary: last seq %d, ms %d-%d; want 8, 20-70", items[2].LastSeq, items[2].MS, items[2].LastMS)
	}
	if items[7].Kind != KindProblem || items[6].Kind != KindIntent {
		t.Errorf("kinds: refused %q, intent %q", items[7].Kind, items[6].Kind)
	}
}

// A line that does not parse is named by the verdict and not drawn; the
// lines after it are drawn, marked.
func TestUnparsableLine(t *testing.T) {
	raw := chain(t, "created", nil, "started", F{"pid": 1}, "final", F{"state": "finished", "exit_code": 0})
	lines := bytes.SplitAfter(raw, []byte("\n"))
	raw = append(append(append([]byte{}, lines[0]...), []byte("{not json\n")...), bytes.Join(lines[1:], nil)...)
	items, v := Build(raw)
	if v.Intact || v.BadLine != 2 || v.UntrustedFrom != 2 {
		t.Fatalf("verify: %+v", v)
	}
	if len(items) != 3 || items[0].Untrusted || !items[1].Untrusted || !items[2].Untrusted {
		t.Errorf("items: %+v", items)
	}
}

// Colour is added to the last column only, and not at all without it.
func TestRenderColour(t *testing.T) {
	raw := chain(t, "created", nil, "deadline_expired", F{"by": "watchdog", "cause": "lease"})
	items, v := Build(raw)
	s := &Show{RunID: "r", State: "cancelling", Events: items, Verify: v}
	var plain, col bytes.Buffer
	Render(&plain, s, Options{})
	Render(&col, s, Options{Colour: true})
	if strings.Contains(plain.String(), "\x1b") {
		t.Errorf("colour without Colour:\n%s", plain.String())
	}
	if !strings.Contains(col.String(), "watchdog \x1b[1;31mINTENT deadline expired: cause lease\x1b[0m\n") {
		t.Errorf("no coloured intent:\n%q", col.String())
	}
	stripped := strings.NewReplacer("\x1b[1;31m", "", "\x1b[0m", "", "\x1b[32m", "").Replace(col.String())
	if stripped != plain.String() {
		t.Errorf("coloured output is not the plain one plus colours:\n%s\n%s", stripped, plain.String())
	}
}

// Durations are drawn as written: a zero digit of a number is kept (30s is
// "30s", not "3s"; 90s is "1m30s"), only a zero unit after a larger one is
// dropped (300s is "5m", 3600s "1h").
func TestDurationsWithZeroDigits(t *testing.T) {
	for _, c := range []struct {
		lease, grace float64
		want         string
	}{
		{30, 10, "created: lease 30s, grace 10s"},
		{90, 0.5, "created: lease 1m30s, grace 500ms"},
		{300, 20, "created: lease 5m, grace 20s"},
		{600, 60, "created: lease 10m, grace 1m"},
		{3600, 100, "created: lease 1h, grace 1m40s"},
		{3630, 1.5, "created: lease 1h0m30s, grace 1.5s"},
		{4200, 3, "created: lease 1h10m, grace 3s"},
		{0, 5, "created: lease none, grace 5s"},
	} {
		items, v := Build(chain(t, "created", F{"lease_seconds": c.lease, "grace_seconds": c.grace}))
		if !v.Intact || len(items) != 1 {
			t.Fatalf("lease %v: verify %+v, %d items", c.lease, v, len(items))
		}
		if items[0].Text != c.want {
			t.Errorf("lease %vs, grace %vs: %q, want %q", c.lease, c.grace, items[0].Text, c.want)
		}
	}
}

// A final line whose survivors are null (a stop with no proof beyond the
// job's session) is drawn as a problem, never as "nothing survived".
func TestFinalSurvivorsUnknown(t *testing.T) {
	raw := chain(t,
		"created", nil,
		"started", F{"pid": 10, "pgid": 10, "sid": 10},
		"final", F{"state": "cancelled", "cause": "cancel", "exit_code": 143, "survivors": nil, "containment": "session", "by": "cancel"},
	)
	items, _ := Build(raw)
	last := items[len(items)-1]
	if last.Kind != KindProblem || strings.Contains(last.Text, "nothing survived") || !strings.Contains(last.Text, "survivors unknown (containment session)") {
		t.Fatalf("final drawn as %q %q", last.Kind, last.Text)
	}
}

// A final line appended late (a stop that could not journal while a stuck
// process held the journal's lock) says so, and who appended it.
func TestFinalJournaledLate(t *testing.T) {
	raw := chain(t,
		"created", nil,
		"started", F{"pid": 10, "pgid": 10, "sid": 10},
		"intent_unrecorded", F{"by": "renew", "cause": "lease", "late": true},
		"final", F{"state": "cancelled", "cause": "lease", "exit_code": 124, "survivors": []any{}, "containment": "cgroup", "by": "renew", "late": true},
	)
	items, _ := Build(raw)
	last := items[len(items)-1]
	if last.Kind != KindFinal || last.Text != "final: cancelled (lease), exit 124, journaled late by renew, nothing survived" {
		t.Fatalf("final drawn as %q %q", last.Kind, last.Text)
	}
}
