//go:build linux

package journal_test

import (
	"bytes"
	"errors"
	"regexp"
	"testing"

	"github.com/agent-wrap/agent-wrap/journal"
)

var hexRE = regexp.MustCompile(`^([0-9a-f]{64})?$`)

// FuzzParseLine: ParseLine never panics, and an accepted line has a positive
// seq, a non-empty event, a prev that is "" or a hex SHA-256, and no
// reserved key among its fields.
func FuzzParseLine(f *testing.F) {
	f.Add([]byte(`{"seq":1,"at":"2026-12-02T11:00:00.123456789Z","mono_ns":5,"event":"created","wrapper_pid":9,"prev":""}`))
	f.Add([]byte(`{"seq":2,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"started","pid":10,"prev":"` + journal.Hash([]byte("x")) + `"}`))
	f.Add([]byte(`{"seq":0,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","prev":""}`))
	f.Add([]byte(`{"seq":1,"at":"yesterday","mono_ns":6,"event":"x","prev":""}`))
	f.Add([]byte(`{"seq":1,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","prev":null}`))
	f.Add([]byte(`{"seq":1,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","prev":"zz"}`))
	f.Add([]byte(`{"seq":1,"seq":2,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","prev":""}`))
	f.Add([]byte(`{"seq":1.5,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","prev":""}`))
	f.Add([]byte(`{"seq":1,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","pr`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := journal.ParseLine(line)
		if err != nil {
			return
		}
		if e.Seq < 1 || e.Event == "" {
			t.Fatalf("ParseLine(%q) accepted seq %d, event %q", line, e.Seq, e.Event)
		}
		if !hexRE.MatchString(e.Prev) {
			t.Fatalf("ParseLine(%q) accepted prev %q, not a hex SHA-256", line, e.Prev)
		}
		for _, k := range []string{"seq", "at", "mono_ns", "event", "prev"} {
			if _, ok := e.Fields[k]; ok {
				t.Fatalf("ParseLine(%q) left reserved key %q among the fields", line, k)
			}
		}
	})
}

// FuzzVerify: Verify never panics on any input, and when it passes a
// journal, every line parses, seq counts from 1 and each prev is the hash of
// the line before: a pass is never wrong.
func FuzzVerify(f *testing.F) {
	f.Add(realJournal(f))
	f.Add([]byte(""))
	f.Add([]byte("\n"))
	f.Add([]byte(`{"seq":1,"at":"2026-12-02T11:00:00Z","mono_ns":6,"event":"x","prev":""}`))
	f.Add([]byte("{\"seq\":1,\"at\":\"2026-12-02T11:00:00Z\",\"mono_ns\":6,\"event\":\"x\",\"prev\":\"\"}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := journal.Verify(bytes.NewReader(b))
		if err != nil {
			var bad *journal.BadLineError
			if errors.As(err, &bad) && (bad.Line < 1 || bad.Line > n) {
				t.Fatalf("Verify named line %d of %d", bad.Line, n)
			}
			return
		}
		lines := bytes.SplitAfter(b, []byte("\n"))
		if len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1]
		}
		if n != len(lines) || n == 0 {
			t.Fatalf("Verify passed %d lines of %d", n, len(lines))
		}
		prev := ""
		for i, l := range lines {
			if !bytes.HasSuffix(l, []byte("\n")) {
				t.Fatalf("Verify passed line %d without a newline", i+1)
			}
			l = l[:len(l)-1]
			e, err := journal.ParseLine(l)
			if err != nil || e.Seq != int64(i+1) || e.Prev != prev {
				t.Fatalf("Verify passed line %d: %q (%v)", i+1, l, err)
			}
			prev = journal.Hash(l)
		}
	})
}

// FuzzVerifyTamper changes one byte of a real journal, anywhere before its
// last line: Verify must refuse the journal, since the change breaks the
// hash chain even where the edited line still parses.
func FuzzVerifyTamper(f *testing.F) {
	j := realJournal(f)
	f.Add(uint(0), byte('x'))
	f.Add(uint(10), byte('9'))
	f.Add(uint(len(j)/2), byte('\n'))
	f.Add(uint(bytes.IndexByte(j, '\n')), byte(' '))
	f.Fuzz(func(t *testing.T, pos uint, b byte) {
		last := bytes.LastIndexByte(j[:len(j)-1], '\n') // end of the line before the last
		p := int(pos % uint(last+1))
		if j[p] == b {
			return
		}
		m := bytes.Clone(j)
		m[p] = b
		if _, err := journal.Verify(bytes.NewReader(m)); err == nil {
			t.Fatalf("Verify passed a journal with byte %d changed from %q to %q:\n%s", p, j[p], b, m)
		}
	})
}

// realJournal writes a small journal with journal.Append, as a run does.
func realJournal(tb testing.TB) []byte {
	tb.Helper()
	_, d := createRun(tb, tb.TempDir(), "fuzz-1")
	for _, ev := range []struct {
		name string
		f    journal.Fields
	}{
		{"created", journal.Fields{"wrapper_pid": 100, "lease_seconds": 300.0}},
		{"started", journal.Fields{"pid": 101, "pgid": 101, "sid": 101, "leader_start": 5555}},
		{"cancel_requested", journal.Fields{"cause": "cancel", "by": "cancel"}},
		{"signal_sent", journal.Fields{"signal": "TERM", "pids": []int{101, 102}, "target": "group"}},
		{"final", journal.Fields{"state": "cancelled", "exit_code": 143, "survivors": []int{}}},
	} {
		if _, err := journal.Append(d, ev.name, ev.f, false); err != nil {
			tb.Fatal(err)
		}
	}
	return events(tb, d)
}
