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

// A torn last line is never chained to: Append refuses it.
func TestAppendRefusesTornTail(t *testing.T) {
	d := newDir(t)
	Append(d, "a", nil, false)
	f, _ := os.OpenFile(filepath.Join(d.Path, rundir.EventsFile), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":2,"at`)
	f.Close()
	if _, err := Append(d, "b", nil, false); err == nil || !strings.Contains(err.Error(), "torn") {
		t.Fatalf("Append after a torn line: %v", err)
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

// A Writer whose last line was followed by a torn one (another process
// died mid-write) refuses to chain to it, like a one-line Append.
func TestWriterRefusesTornTailAfterItsOwnLine(t *testing.T) {
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
	if _, err := w.Append("b", nil, false); err == nil || !strings.Contains(err.Error(), "torn") {
		t.Fatalf("Append after a torn line: %v", err)
	}
}
