//go:build linux

package journal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agent-wrap/agent-wrap/rundir"
)

func newDir(t *testing.T) *rundir.Dir {
	t.Helper()
	r, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	d, err := r.Create("j")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestAppendVerify(t *testing.T) {
	d := newDir(t)
	for i, ev := range []string{"created", "started", "final"} {
		seq, err := Append(d, ev, Fields{"n": i, "argv": []string{"a", "b"}}, i == 2)
		if err != nil || seq != int64(i+1) {
			t.Fatalf("Append %s: seq %d, %v", ev, seq, err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(d.Path, rundir.EventsFile))
	if n, err := Verify(bytes.NewReader(b)); err != nil || n != 3 {
		t.Fatalf("Verify: %d, %v\n%s", n, err, b)
	}
	// Keys in a fixed order: seq, at, mono_ns, event, fields..., prev.
	first := strings.SplitN(string(b), "\n", 2)[0]
	if !strings.HasPrefix(first, `{"seq":1,"at":"`) || !strings.HasSuffix(first, `,"prev":""}`) {
		t.Fatalf("line layout: %s", first)
	}
	es, err := ReadAll(bytes.NewReader(b))
	if err != nil || len(es) != 3 || es[1].Event != "started" || es[2].Fields["n"] != float64(2) {
		t.Fatalf("ReadAll: %+v %v", es, err)
	}
	if es[2].Prev != Hash([]byte(strings.Split(string(b), "\n")[1])) {
		t.Fatal("prev is not the hash of the line before")
	}
	if _, err := Append(d, "x", Fields{"seq": 9}, false); err == nil {
		t.Fatal("a reserved field was accepted")
	}
}

// Every kind of tampering is caught, naming the first bad line.
func TestVerifyNamesFirstBadLine(t *testing.T) {
	d := newDir(t)
	for _, ev := range []string{"a", "b", "c", "d"} {
		Append(d, ev, nil, false)
	}
	orig, _ := os.ReadFile(filepath.Join(d.Path, rundir.EventsFile))
	lines := strings.SplitAfter(string(orig), "\n")[:4]
	for name, tc := range map[string]struct {
		content string
		line    int
	}{
		"flipped byte":  {strings.Replace(string(orig), `"event":"b"`, `"event":"x"`, 1), 3},
		"deleted line":  {lines[0] + lines[2] + lines[3], 2},
		"swapped lines": {lines[0] + lines[2] + lines[1] + lines[3], 2},
		"torn tail":     {string(orig) + `{"seq":5`, 5},
		"garbage":       {lines[0] + "not json\n", 2},
	} {
		_, err := Verify(strings.NewReader(tc.content))
		var bad *BadLineError
		if !errors.As(err, &bad) || bad.Line != tc.line {
			t.Errorf("%s: %v, want line %d", name, err, tc.line)
		}
	}
	if _, err := Verify(strings.NewReader("")); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty: %v", err)
	}
}

// Appends from many writers at once (wrapper, cancel, watchdog are separate
// processes; separate descriptors behave the same) keep one unbroken chain.
func TestConcurrentAppends(t *testing.T) {
	d := newDir(t)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if _, err := Append(d, "tick", Fields{"w": w, "i": i}, false); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	f, _ := os.Open(filepath.Join(d.Path, rundir.EventsFile))
	defer f.Close()
	if n, err := Verify(f); err != nil || n != 400 {
		t.Fatalf("Verify after concurrent appends: %d lines, %v", n, err)
	}
}

// A torn last line (a writer died mid-line, or the file was cut with
// truncate -s -3) does not silence the journal: Append ends it, records it
// with a journal_torn line chained to its bytes, and goes on. Verify still
// names the torn line, and says that journal_torn records it.
func TestAppendGoesOnPastATornTail(t *testing.T) {
	for _, tc := range []struct{ name, garbage string }{
		{"cut", `{"seq":2,"at`},
		{"garbled", "not json at all\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDir(t)
			Append(d, "a", nil, false)
			f, _ := os.OpenFile(filepath.Join(d.Path, rundir.EventsFile), os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString(tc.garbage)
			f.Close()
			seq, err := Append(d, "b", nil, true)
			if err != nil || seq != 4 {
				t.Fatalf("Append after a torn line: seq %d, %v; want 4", seq, err)
			}
			if seq, err := Append(d, "c", nil, false); err != nil || seq != 5 {
				t.Fatalf("the next Append: seq %d, %v; want 5", seq, err)
			}
			b, _ := os.ReadFile(filepath.Join(d.Path, rundir.EventsFile))
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			if len(lines) != 5 {
				t.Fatalf("%d lines, want 5:\n%s", len(lines), b)
			}
			torn, err := ParseLine([]byte(lines[2]))
			if err != nil || torn.Event != "journal_torn" || torn.Seq != 3 || torn.Prev != Hash([]byte(lines[1])) || torn.Fields["line"] != float64(2) {
				t.Fatalf("line 3: %+v %v", torn, err)
			}
			_, err = Verify(bytes.NewReader(b))
			var bad *BadLineError
			if !errors.As(err, &bad) || bad.Line != 2 || !strings.Contains(bad.Reason, "journal_torn") {
				t.Fatalf("Verify: %v; want line 2 named, with its journal_torn", err)
			}
			if es := Evidence(bytes.NewReader(b)); len(es) != 4 || es[3].Event != "c" {
				t.Fatalf("Evidence: %+v", es)
			}
		})
	}
}

// A journal cut at a line boundary still chains; the record's mark (the
// last line when the record was written) tells it from a whole one.
func TestVerifyMarkCatchesACutAtALineBoundary(t *testing.T) {
	d := newDir(t)
	for _, ev := range []string{"created", "started", "leader_exited"} {
		if _, err := Append(d, ev, nil, false); err != nil {
			t.Fatal(err)
		}
	}
	m := Tail(d)
	if m.Seq != 3 || len(m.Hash) != 64 {
		t.Fatalf("Tail: %+v", m)
	}
	Append(d, "final", nil, false)
	b, _ := os.ReadFile(filepath.Join(d.Path, rundir.EventsFile))
	if n, err := VerifyMark(bytes.NewReader(b), m); err != nil || n != 4 {
		t.Fatalf("VerifyMark of a whole journal: %d, %v", n, err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	cut := strings.Join(lines[:2], "")
	if n, err := Verify(strings.NewReader(cut)); err != nil || n != 2 {
		t.Fatalf("Verify without a mark passes a cut journal: %d, %v", n, err)
	}
	_, err := VerifyMark(strings.NewReader(cut), m)
	var bad *BadLineError
	if !errors.As(err, &bad) || bad.Line != 3 || !strings.Contains(bad.Reason, "cut") {
		t.Fatalf("VerifyMark of a journal cut after line 2: %v", err)
	}
	// A journal rewritten from the mark's line on, still chaining.
	d2 := newDir(t)
	for _, ev := range []string{"created", "started", "other"} {
		Append(d2, ev, nil, false)
	}
	b2, _ := os.ReadFile(filepath.Join(d2.Path, rundir.EventsFile))
	if _, err := VerifyMark(bytes.NewReader(b2), m); err == nil {
		t.Fatal("VerifyMark passed another journal with the same length")
	}
}

// A Writer keeps its descriptor and its own last line; lines appended
// meanwhile by others (other Writers, one-line Appends: other processes)
// are read back under the lock, so the chain holds whatever the mix.
func TestWriterInterleavedWithOthers(t *testing.T) {
	d := newDir(t)
	w, err := Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	other, err := Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				var err error
				switch (g + i) % 3 {
				case 0:
					_, err = w.Append("wrapper", Fields{"g": g, "i": i}, false)
				case 1:
					_, err = other.Append("other", Fields{"g": g, "i": i}, false)
				default:
					_, err = Append(d, "once", Fields{"g": g, "i": i}, false)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Twice in a row from the same Writer: the second chains to the first
	// without reading it back.
	if seq, err := w.Append("last-1", nil, true); err != nil || seq != 161 {
		t.Fatalf("Append: seq %d, %v; want 161", seq, err)
	}
	if seq, err := w.Append("last-2", nil, false); err != nil || seq != 162 {
		t.Fatalf("Append: seq %d, %v; want 162", seq, err)
	}
	f, _ := os.Open(filepath.Join(d.Path, rundir.EventsFile))
	defer f.Close()
	if n, err := Verify(f); err != nil || n != 162 {
		t.Fatalf("Verify: %d lines, %v; want 162, intact", n, err)
	}
}

// A Writer's Tail is Tail(d): known from its own last line, read back
// after another process's, and zero on an empty journal.
func TestWriterTail(t *testing.T) {
	d := newDir(t)
	w, err := Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if m := w.Tail(); m != (Mark{}) {
		t.Fatalf("empty journal: Tail %+v, want zero", m)
	}
	same := func(what string) {
		t.Helper()
		if got, want := w.Tail(), Tail(d); got != want || got.Seq == 0 {
			t.Fatalf("%s: Writer.Tail %+v, Tail %+v", what, got, want)
		}
	}
	if _, err := w.Append("own", nil, false); err != nil {
		t.Fatal(err)
	}
	same("after its own line")
	if _, err := Append(d, "other", nil, false); err != nil {
		t.Fatal(err)
	}
	same("after another's line")
	if m := w.Tail(); m.Seq != 2 {
		t.Fatalf("Tail %+v, want seq 2", m)
	}
}

// A Writer whose last line was followed by a torn one (another process
// died mid-write) does not chain to it: it reads the tail back, and writes
// journal_torn first, like a one-line Append.
func TestWriterGoesOnPastATornTailAfterItsOwnLine(t *testing.T) {
	d := newDir(t)
	w, err := Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Append("a", nil, false); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(filepath.Join(d.Path, rundir.EventsFile), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":2,"at`)
	f.Close()
	if seq, err := w.Append("b", nil, false); err != nil || seq != 4 {
		t.Fatalf("Append after a torn line: seq %d, %v; want 4", seq, err)
	}
	es := Evidence(mustOpen(t, filepath.Join(d.Path, rundir.EventsFile)))
	if len(es) != 3 || es[1].Event != "journal_torn" {
		t.Fatalf("journal: %+v", es)
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Last finds the last line of the named events reading backwards, across
// chunk boundaries and past torn or foreign lines, and says when there is
// none.
func TestLast(t *testing.T) {
	d := newDir(t)
	pad := strings.Repeat("x", 3000)
	Append(d, "started", Fields{"deadline_epoch": 1}, false)
	for i := 0; i < 100; i++ { // ~300 KiB: several chunks
		Append(d, "action", Fields{"pad": pad, "i": i}, false)
		if i == 40 {
			Append(d, "lease_renewed", Fields{"deadline_epoch": 2, "pad": pad}, false)
		}
	}
	f, _ := os.OpenFile(filepath.Join(d.Path, rundir.EventsFile), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":999,"event":"lease_renewed","deadline_epoch":9`) // torn
	f.Close()
	r := mustOpen(t, filepath.Join(d.Path, rundir.EventsFile))
	fi, _ := r.Stat()
	e, ok := Last(r, fi.Size(), "started", "lease_renewed")
	if !ok || e.Event != "lease_renewed" || e.Fields["deadline_epoch"] != float64(2) {
		t.Fatalf("Last: %+v %v", e, ok)
	}
	if e, ok := Last(r, fi.Size(), "started"); !ok || e.Seq != 1 {
		t.Fatalf("Last started: %+v %v", e, ok)
	}
	if _, ok := Last(r, fi.Size(), "final"); ok {
		t.Fatal("Last found a final line in a journal without one")
	}
}
