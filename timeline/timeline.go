// Package timeline turns a run's journal into a timeline a person reads in
// one screen: `agent-wrap show` on the host, and `agent-wrap ledger show`
// on the controller, which draws the host's timeline as it received it.
//
// What it guarantees:
//   - Every journal line is in the timeline, as a line of its own or
//     counted in a summary line: lease renewals, and actions (agent
//     requests, authorize answers, gateway requests) per channel. A summary
//     never spans an event that is not summarized, so an action after the
//     intent is drawn after the intent, never folded into a line before it.
//   - An event the package does not know is drawn with its fields as they
//     are, so a newer wrapper's events show on an older reader.
//   - The chain is verified (journal.Verify) and the result is drawn at the
//     bottom. A broken chain is said, with its first bad line, and every
//     line from it on is marked as not trusted.
//
// It reads and judges; it never signals anything or writes a file.
package timeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
)

// Kind says what a line is, for colour and for readers of --json.
const (
	KindInfo    = "info"    // start, end of the leader, other facts
	KindIntent  = "intent"  // deadline_expired, cancel_requested: the decision to stop
	KindSignal  = "signal"  // a signal sent (or refused)
	KindEscape  = "escape"  // a descendant that left the group
	KindRevoke  = "revoke"  // authority revoked
	KindAction  = "action"  // an authority action or a summary of actions
	KindRenew   = "renew"   // lease renewals
	KindHandoff = "handoff" // a nested run started or ended elsewhere
	KindFinal   = "final"   // the final record
	KindProblem = "problem" // survivors, a refused stop, a launch failure
)

// Item is one line of the timeline: one journal line, or a summary of
// several (Count > 1, Seq..LastSeq).
type Item struct {
	Seq     int64     `json:"seq"`
	LastSeq int64     `json:"last_seq,omitempty"` // a summary's last journal line
	Count   int       `json:"count"`              // journal lines in this item
	At      time.Time `json:"at"`
	MS      int64     `json:"ms"`                // since the journal's first line
	LastMS  int64     `json:"last_ms,omitempty"` // a summary's last line, since the first
	Actor   string    `json:"actor"`             // wrapper, watchdog, cancel, renew, gateway, ...
	Event   string    `json:"event"`
	Kind    string    `json:"kind"`
	Text    string    `json:"text"`
	// Fields are the journal line's own fields, when the item is one line.
	Fields map[string]any `json:"fields,omitempty"`
	// Counts, for a summary of actions: lines per decision and per
	// request or status, e.g. {"accepted": 3, "refused": 1, "sign": 2}.
	Counts map[string]int `json:"counts,omitempty"`
	// Untrusted: the line is at or after the first line that breaks the
	// chain.
	Untrusted bool `json:"untrusted,omitempty"`
}

// Verify is the chain's verdict.
type Verify struct {
	Intact  bool   `json:"intact"`
	Lines   int    `json:"lines"`              // lines read
	BadLine int    `json:"bad_line,omitempty"` // the first line that breaks the chain
	Reason  string `json:"reason,omitempty"`
	// UntrustedFrom is the first line that may not be as written: the bad
	// line, or the one before it when the bad line's prev does not match
	// (an edit of a line shows as the next line's prev).
	UntrustedFrom int `json:"untrusted_from,omitempty"`
}

// Build reads a whole journal and returns its timeline and the chain's
// verdict. Lines that do not parse are not drawn (they are named by the
// verdict); lines that parse after a break are drawn and marked.
func Build(raw []byte) ([]Item, Verify) {
	v := verify(raw)
	entries := parseAll(raw)
	return group(entries, v), v
}

func verify(raw []byte) Verify {
	n, err := journal.Verify(bytes.NewReader(raw))
	if err == nil {
		return Verify{Intact: true, Lines: n}
	}
	v := Verify{Lines: n, Reason: err.Error()}
	var bad *journal.BadLineError
	if errors.As(err, &bad) {
		v.BadLine, v.Reason, v.UntrustedFrom = bad.Line, bad.Reason, bad.Line
		if strings.HasPrefix(bad.Reason, "prev does not match") && bad.Line > 1 {
			v.UntrustedFrom = bad.Line - 1
		}
	} else {
		v.UntrustedFrom = n + 1 // the journal could not be read past line n
	}
	return v
}

// line is one parsed journal line and its place in the file.
type line struct {
	journal.Entry
	n int // 1-based line number
}

func parseAll(raw []byte) []line {
	var out []line
	for i, b := range bytes.Split(raw, []byte{'\n'}) {
		if len(b) == 0 {
			continue
		}
		e, err := journal.ParseLine(b)
		if err != nil {
			continue
		}
		out = append(out, line{Entry: e, n: i + 1})
	}
	return out
}

// summarized reports whether lines of this event are counted into a
// summary line rather than drawn one by one.
func summarized(event string) bool {
	return event == "lease_renewed" || event == "action" || event == "action_end"
}

// group draws the lines in order. Between two lines that are drawn one by
// one, the summarized lines are collected per (event, channel) and drawn at
// the place of the first of each.
func group(lines []line, v Verify) []Item {
	if len(lines) == 0 {
		return nil
	}
	t0 := lines[0]
	since := func(l line) int64 {
		if l.MonoNS >= t0.MonoNS && t0.MonoNS > 0 {
			return (l.MonoNS - t0.MonoNS) / int64(time.Millisecond)
		}
		return l.At.Sub(t0.At).Milliseconds()
	}
	channels := map[int64]string{} // an action's seq -> its channel, for action_end
	var out []Item
	open := map[string]int{} // summary key -> index in out, until the next single line
	for _, l := range lines {
		untrusted := v.UntrustedFrom > 0 && l.n >= v.UntrustedFrom
		if l.Event == "action" {
			channels[l.Seq] = str(l.Fields, "channel")
		}
		if !summarized(l.Event) {
			clear(open)
			it := single(l)
			it.MS, it.Untrusted = since(l), untrusted
			out = append(out, it)
			continue
		}
		ch := str(l.Fields, "channel")
		if ch == "" && l.Event == "action_end" {
			ch = channels[int64(num(l.Fields, "action"))]
		}
		key := l.Event + "\x00" + ch
		i, ok := open[key]
		if !ok {
			out = append(out, Item{Seq: l.Seq, At: l.At, MS: since(l), Event: l.Event, Actor: actor(l.Entry), Counts: map[string]int{}, Fields: l.Fields})
			i = len(out) - 1
			open[key] = i
		}
		it := &out[i]
		it.Count++
		if it.Count > 1 {
			it.Fields = nil // a summary's lines are counted, not listed
		}
		it.LastSeq, it.LastMS = l.Seq, since(l)
		it.Untrusted = it.Untrusted || untrusted
		count(it, l)
		it.Kind, it.Text = summaryText(it, ch, l)
	}
	for i := range out {
		if out[i].Count == 1 {
			out[i].LastSeq, out[i].LastMS = 0, 0
		}
	}
	return out
}

// count adds one summarized line to a summary's counts.
func count(it *Item, l line) {
	switch l.Event {
	case "action":
		it.Counts[orDash(str(l.Fields, "decision"))]++
		if r := str(l.Fields, "request"); r != "" {
			it.Counts["request:"+r]++
		}
		if str(l.Fields, "decision") != "accepted" {
			it.Counts["reason:"+orDash(str(l.Fields, "reason"))]++
		}
	case "action_end":
		if s, ok := l.Fields["status"]; ok {
			it.Counts["status:"+compact(s)]++
		}
		if b, _ := l.Fields["cut"].(bool); b {
			it.Counts["cut"]++
		}
	}
}

// summaryText is the line of a summary as it stands after its latest line
// (the renewal's deadline is the last one's).
func summaryText(it *Item, ch string, last line) (kind, text string) {
	switch it.Event {
	case "lease_renewed":
		t := fmt.Sprintf("lease renewed %s", times(it.Count))
		if dl := num(last.Fields, "deadline_epoch"); dl > 0 {
			t += ", deadline " + clock(int64(dl))
		}
		if s := num(last.Fields, "lease_seconds"); s > 0 {
			t += " (lease " + seconds(s) + ")"
		}
		return KindRenew, t
	case "action":
		t := orDash(ch) + ": " + plural(it.Count, "request")
		if rq := sub(it.Counts, "request:"); rq != "" {
			t += " (" + rq + ")"
		}
		t += fmt.Sprintf(", %d accepted", it.Counts["accepted"])
		if r := it.Count - it.Counts["accepted"]; r > 0 {
			t += fmt.Sprintf(", %d refused (%s)", r, sub(it.Counts, "reason:"))
			return KindProblem, t
		}
		return KindAction, t
	case "action_end":
		t := fmt.Sprintf("%s: %s ended", orDash(ch), plural(it.Count, "request"))
		if st := sub(it.Counts, "status:"); st != "" {
			t += " (status " + st + ")"
		}
		if c := it.Counts["cut"]; c > 0 {
			t += fmt.Sprintf(", %d cut", c)
			return KindProblem, t
		}
		return KindAction, t
	}
	return KindInfo, it.Event
}

// single draws one journal line.
func single(l line) Item {
	it := Item{Seq: l.Seq, Count: 1, At: l.At, Event: l.Event, Actor: actor(l.Entry), Fields: l.Fields}
	it.Kind, it.Text = describe(l.Entry)
	return it
}

// actor is who wrote the line: its "by" field, else what the event says.
func actor(e journal.Entry) string {
	if by := str(e.Fields, "by"); by != "" {
		return by
	}
	switch e.Event {
	case "lease_renewed":
		return "renew"
	case "action", "action_end":
		if ch := str(e.Fields, "channel"); ch == "authorize" || (ch != "" && ch != "ssh-agent" && ch != "handoff" && !strings.HasPrefix(ch, "http:")) {
			return "authorize"
		}
		return "gateway"
	}
	return "wrapper"
}

// describe is the text of one line that is drawn alone.
func describe(e journal.Entry) (string, string) {
	f := e.Fields
	switch e.Event {
	case "created":
		return KindInfo, fmt.Sprintf("created: lease %s, grace %s%s", seconds(num(f, "lease_seconds")), seconds(num(f, "grace_seconds")), opt(", boundary ", str(f, "boundary")))
	case "started":
		t := fmt.Sprintf("started: pid %d (pgid %d, sid %d)", int(num(f, "pid")), int(num(f, "pgid")), int(num(f, "sid")))
		if dl := num(f, "deadline_epoch"); dl > 0 {
			t += ", deadline " + clock(int64(dl))
		}
		return KindInfo, t
	case "deadline_expired":
		return KindIntent, "INTENT deadline expired" + opt(": cause ", str(f, "cause"))
	case "cancel_requested":
		return KindIntent, "INTENT cancel requested" + opt(": cause ", str(f, "cause"))
	case "signal_sent":
		t := fmt.Sprintf("signal %s to %s%s: pids %s", str(f, "signal"), orDash(str(f, "target")), optNum(" pgid ", f, "pgid"), list(f["pids"]))
		if esc := list(f["escaped"]); esc != "-" {
			t += ", escaped " + esc
		}
		return KindSignal, t
	case "signal_refused", "stop_refused":
		return KindProblem, strings.ReplaceAll(e.Event, "_", " ") + ": " + rest(f, "by")
	case "escaped":
		return KindEscape, fmt.Sprintf("escaped: pid %d (pgid %d, sid %d)%s", int(num(f, "pid")), int(num(f, "pgid")), int(num(f, "sid")), argv(f["argv"]))
	case "leader_exited":
		if s := str(f, "signal"); s != "" {
			return KindInfo, fmt.Sprintf("leader %d killed by %s", int(num(f, "pid")), s)
		}
		return KindInfo, fmt.Sprintf("leader %d exited %s", int(num(f, "pid")), compact(f["exit_code"]))
	case "stragglers_stopped":
		t := "stragglers stopped: pids " + list(f["pids"])
		if s := list(f["survivors"]); s != "-" {
			return KindProblem, t + ", SURVIVORS " + s
		}
		return KindInfo, t
	case "authority_revoked":
		t := "authority revoked: " + orDash(str(f, "channel"))
		if c := list(f["cut"]); c != "-" {
			t += ", cut actions " + c
		}
		if er := str(f, "error"); er != "" {
			return KindProblem, t + ", error: " + er
		}
		return KindRevoke, t
	case "agent_scoped":
		return KindInfo, "ssh agent scoped to the run" + opt(": ", str(f, "socket"))
	case "agent_inherited":
		return KindInfo, "ssh agent inherited (not scoped)"
	case "handoff":
		return KindHandoff, fmt.Sprintf("handoff: run %s on %s (controller pid %d%s)", str(f, "run_id"), str(f, "dest"), int(num(f, "controller_pid")), optSeconds(", lease ", f, "lease_seconds"))
	case "handoff_end":
		t := fmt.Sprintf("handoff ended: run %s on %s: %s%s%s", str(f, "run_id"), str(f, "dest"), orDash(str(f, "outcome")), optNum(", exit ", f, "exit_code"), opt(", learned ", str(f, "learned")))
		if str(f, "outcome") == "unknown" {
			return KindProblem, t + opt(", lease ends at ", str(f, "lease_ends_at"))
		}
		return KindHandoff, t
	case "launch_failed":
		return KindProblem, "launch failed: " + rest(f)
	case "final":
		t := fmt.Sprintf("final: %s%s, exit %s%s", str(f, "state"), opt(" (", str(f, "cause"), ")"), compact(f["exit_code"]), opt(", signal ", str(f, "signal")))
		if f["late"] == true {
			// Appended after the final record by the first process that
			// found the run over, once a stuck holder let go of the journal.
			t += opt(", journaled late by ", str(f, "by"))
		}
		if s := list(f["survivors"]); s != "-" {
			return KindProblem, t + ", SURVIVORS " + s
		}
		if v, ok := f["survivors"]; ok && v == nil {
			// null: the stop had no proof beyond the job's session.
			return KindProblem, t + ", survivors unknown" + opt(" (containment ", str(f, "containment"), ")")
		}
		if _, ok := f["survivors"]; ok {
			t += ", nothing survived"
		}
		return KindFinal, t
	}
	t := strings.ReplaceAll(e.Event, "_", " ")
	if r := rest(f, "by"); r != "" {
		t += ": " + r
	}
	return KindInfo, t
}

// rest draws fields generically, sorted by name: k=v, values as compact
// JSON (strings bare).
func rest(f map[string]any, skip ...string) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		if !contains(skip, k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + compact(f[k])
	}
	return strings.Join(parts, " ")
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if x == y {
			return true
		}
	}
	return false
}

// compact is a value as compact JSON; a string as itself.
func compact(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if v == nil {
		return "-"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func str(f map[string]any, k string) string {
	s, _ := f[k].(string)
	return s
}

func num(f map[string]any, k string) float64 {
	n, _ := f[k].(float64)
	return n
}

func opt(prefix, s string, suffix ...string) string {
	if s == "" {
		return ""
	}
	return prefix + s + strings.Join(suffix, "")
}

func optNum(prefix string, f map[string]any, k string) string {
	if _, ok := f[k].(float64); !ok {
		return ""
	}
	return prefix + compact(f[k])
}

func optSeconds(prefix string, f map[string]any, k string) string {
	if _, ok := f[k].(float64); !ok {
		return ""
	}
	return prefix + seconds(num(f, k))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// list draws a JSON list of numbers as "1 2 3"; "-" when empty or absent.
func list(v any) string {
	xs, _ := v.([]any)
	if len(xs) == 0 {
		return "-"
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = compact(x)
	}
	return strings.Join(parts, " ")
}

func argv(v any) string {
	xs, _ := v.([]any)
	if len(xs) == 0 {
		return ""
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = compact(x)
	}
	return ": " + strings.Join(parts, " ")
}

// seconds draws a number of seconds as a Go duration ("5m0s" as "5m").
func seconds(s float64) string {
	if s == 0 {
		return "none"
	}
	// Duration.String spells 5m as "5m0s" and 1h as "1h0m0s": drop only a
	// zero unit that follows a larger one, never a zero digit of a number
	// (30s stays "30s", 90s "1m30s").
	d := time.Duration(s * float64(time.Second)).String()
	if strings.HasSuffix(d, "m0s") {
		d = strings.TrimSuffix(d, "0s")
	}
	if strings.HasSuffix(d, "h0m") {
		d = strings.TrimSuffix(d, "0m")
	}
	return d
}

// clock draws Unix seconds as a UTC time of day with its date.
func clock(epoch int64) string {
	return time.Unix(epoch, 0).UTC().Format("2006-01-02 15:04:05Z")
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// sub draws the counts under one prefix, most first: "sign×3, identities"
// (a count of one is the name alone).
func sub(c map[string]int, prefix string) string {
	type kv struct {
		k string
		n int
	}
	var xs []kv
	for k, n := range c {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			xs = append(xs, kv{rest, n})
		}
	}
	sort.Slice(xs, func(i, j int) bool {
		if xs[i].n != xs[j].n {
			return xs[i].n > xs[j].n
		}
		return xs[i].k < xs[j].k
	})
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = x.k
		if x.n > 1 {
			parts[i] += fmt.Sprintf("×%d", x.n)
		}
	}
	return strings.Join(parts, ", ")
}
