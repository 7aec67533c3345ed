package bench

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []float64
		want float64
	}{
		{"odd", []float64{3, 1, 2}, 2},
		{"even", []float64{4, 1, 3, 2}, 2.5},
		{"one", []float64{7}, 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Median(c.in); got != c.want {
				t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
			}
		})
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
}

func TestInterleaveAlternatesAndDropsWarmup(t *testing.T) {
	var order []string
	a := func() (float64, error) { order = append(order, "A"); return float64(len(order)), nil }
	b := func() (float64, error) { order = append(order, "B"); return float64(len(order)), nil }
	s, err := Interleave(1, 2, a, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(order); got != 6 {
		t.Fatalf("ran %d times, want 6", got)
	}
	for i, want := range []string{"A", "B", "A", "B", "A", "B"} {
		if order[i] != want {
			t.Fatalf("order %v, want A,B alternating", order)
		}
	}
	if len(s[0]) != 2 || s[0][0] != 3 || s[1][1] != 6 {
		t.Errorf("samples %v: want the warm-up round dropped", s)
	}
}

func TestInterleaveRotatingRotatesAndKeepsRounds(t *testing.T) {
	var order []string
	side := func(name string) func() (float64, error) {
		return func() (float64, error) { order = append(order, name); return float64(len(order)), nil }
	}
	s, err := InterleaveRotating(0, 3, side("A"), side("B"), side("C"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, ""), "ABCBCACAB"; got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
	// Round 1 ran B (4th), C (5th), A (6th).
	if s[0][1] != 6 || s[1][1] != 4 || s[2][1] != 5 {
		t.Errorf("samples %v: want each kept in its round", s)
	}
}

func TestMedianCI(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // descending: MedianCI must sort
		}
		return xs
	}
	for _, c := range []struct {
		n      int
		lo, hi float64
	}{
		{5, 1, 5},   // P(B=0) = 1/32 > 2.5 %: the whole range
		{9, 2, 8},   // P(B<=1) = 10/512 = 1.95 %
		{20, 6, 15}, // P(B<=5) = 2.07 %, P(B<=6) = 5.77 %
	} {
		if lo, hi := MedianCI(seq(c.n)); lo != c.lo || hi != c.hi {
			t.Errorf("MedianCI(1..%d) = %v, %v; want %v, %v", c.n, lo, hi, c.lo, c.hi)
		}
	}
	if lo, hi := MedianCI(nil); !math.IsNaN(lo) || !math.IsNaN(hi) {
		t.Error("MedianCI(nil) is not NaN")
	}
}

// newFixture builds a fixture in a fresh root; the live runs point at this
// test process (alive, with its real start time).
func newFixture(t testing.TB) *Fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "runs")
	root, err := rundir.OpenRoot(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	self, err := proc.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	boot, _ := proc.BootID()
	return &Fixture{Root: root, BootID: boot, Leader: self, Wrapper: self, Dead: proc.Stat{PID: 999999, Start: 1}}
}

func TestFixtureRunsAreValid(t *testing.T) {
	fx := newFixture(t)
	if err := fx.Write("live", 0, 3, true); err != nil {
		t.Fatal(err)
	}
	if err := fx.Write("done", 0, 5, false); err != nil {
		t.Fatal(err)
	}
	n, err := ReadAllStatus(fx.Root.Path)
	if err != nil || n != 8 {
		t.Fatalf("ReadAllStatus = %d, %v; want 8 records", n, err)
	}
	now := time.Now().Unix()
	for _, c := range []struct {
		id    string
		state string
		ahead bool
	}{{"live-1", statusfile.Running, true}, {"done-4", statusfile.Finished, false}} {
		d, err := fx.Root.Open(c.id)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := statusfile.Read(d)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != c.state {
			t.Errorf("%s: state %s, want %s", c.id, rec.State, c.state)
		}
		dl, err := lease.ReadDeadline(d)
		if err != nil {
			t.Fatal(err)
		}
		if (dl > now) != c.ahead {
			t.Errorf("%s: deadline %d, now %d: want ahead=%v", c.id, dl, now, c.ahead)
		}
		f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := journal.Verify(f); err != nil {
			t.Errorf("%s: journal: %v", c.id, err)
		}
		f.Close()
		d.Close()
	}
}

// The benchmarks below take apart the fixed costs of a run: what one
// durable record, one synced journal line and one /proc scan cost here.
// go test -run '^$' -bench . ./bench

func benchDir(b *testing.B) *rundir.Dir {
	fx := newFixture(b)
	d, err := fx.Root.Create("bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

func benchmarkStatusWrite(b *testing.B, durable bool) {
	d := benchDir(b)
	rec := &statusfile.Record{RunID: "bench", State: statusfile.Running, Command: []string{"true"}, Survivors: []int{}}
	for b.Loop() {
		if err := statusfile.Write(d, rec, durable); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStatusWrite(b *testing.B)        { benchmarkStatusWrite(b, false) }
func BenchmarkStatusWriteDurable(b *testing.B) { benchmarkStatusWrite(b, true) }

func benchmarkJournalAppend(b *testing.B, sync bool) {
	d := benchDir(b)
	for b.Loop() {
		if _, err := journal.Append(d, "bench", journal.Fields{"pid": 1}, sync); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJournalAppend(b *testing.B)     { benchmarkJournalAppend(b, false) }
func BenchmarkJournalAppendSync(b *testing.B) { benchmarkJournalAppend(b, true) }

func BenchmarkProcScan(b *testing.B) {
	for b.Loop() {
		if _, err := proc.Scan(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadAllStatus1k(b *testing.B) {
	fx := newFixture(b)
	if err := fx.Write("live", 0, 100, true); err != nil {
		b.Fatal(err)
	}
	if err := fx.Write("done", 0, 900, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if n, err := ReadAllStatus(fx.Root.Path); err != nil || n != 1000 {
			b.Fatal(n, err)
		}
	}
}
