//go:build linux && !race

// Allocation counts are this file's alone: the race detector allocates on
// the code's behalf and changes them, so these tests are built only
// without it (make race runs the rest of the package under it).

package proc

import (
	"errors"
	"os"
	"slices"
	"testing"
)

// TestReadStatAllocs: reading a process's stat allocates its command
// name, not its path, a buffer or a slice of fields: list judges every live run by its wrapper's stat, and the
// wrapper's backstop scan reads its members' every second.
func TestReadStatAllocs(t *testing.T) {
	pid := os.Getpid()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ReadStat(pid); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Fatalf("ReadStat allocates %.0f times a call, want at most 1", allocs)
	}
}

// TestGoneAllocs: reading a PID that names no process allocates at most
// its error (a number, not a formatted string): a wrapper's look reads the
// stat of every PID handed out since its last one, most of them gone.
func TestGoneAllocs(t *testing.T) {
	pid, err := PIDMax()
	if err != nil {
		t.Skip(err)
	}
	if _, err := ReadStat(pid); !errors.Is(err, ErrGone) {
		t.Skipf("pid %d: %v (want it free)", pid, err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ReadStat(pid); !errors.Is(err, ErrGone) {
			t.Fatal(err)
		}
		if _, err := ReadRunTime(pid); !errors.Is(err, ErrGone) {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Fatalf("ReadStat and ReadRunTime of a gone PID allocate %.0f times, want at most 2", allocs)
	}
}

// TestQuietReadsAllocs: what a wrapper's quiet look reads (the last PID,
// a member's run time) allocates nothing: it runs every second or two for
// the life of the run, in a process that may never collect its garbage.
func TestQuietReadsAllocs(t *testing.T) {
	f, err := OpenLastPID()
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	pid := os.Getpid()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := f.Read(); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadRunTime(pid); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Fatalf("LastPIDFile.Read and ReadRunTime allocate %.0f times, want none", allocs)
	}
}

// TestScanIntoAllocs: a scan into a table kept from the last one allocates
// each process's command name and nothing per process besides.
func TestScanIntoAllocs(t *testing.T) {
	table, err := ScanInto(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(table, func(s Stat) bool { return s.PID == os.Getpid() }) {
		t.Fatalf("ScanInto: %d processes, not this one (%d)", len(table), os.Getpid())
	}
	table = slices.Grow(table, 1000)
	// The table changes between the runs on a busy host: the bound is
	// the most processes one run read, with a tenth more for those that
	// exit between the listing and the read of their stat.
	var n int
	allocs := testing.AllocsPerRun(20, func() {
		table, _ = ScanInto(table, nil)
		n = max(n, len(table))
	})
	if allocs > float64(n)*1.1+3 {
		t.Fatalf("ScanInto of at most %d processes allocates %.0f times a run, want at most one a process", n, allocs)
	}
}
