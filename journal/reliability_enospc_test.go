//go:build linux

package journal_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// createRun makes the run root dir/runs and run id in it, both closed at
// cleanup.
func createRun(tb testing.TB, dir, id string) (*rundir.Root, *rundir.Dir) {
	tb.Helper()
	root, err := rundir.OpenRoot(filepath.Join(dir, "runs"), true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { root.Close() })
	d, err := root.Create(id)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return root, d
}

// events is the run's journal file as it stands.
func events(tb testing.TB, d *rundir.Dir) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(d.Path, rundir.EventsFile))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// A journal on a full file system: appends fail with ENOSPC, but no torn
// line is ever left behind (the kernel may write part of a line before it
// runs out of space), so the journal still verifies, and once space returns
// appends chain on from the last whole line.
func TestAppendOnFullDisk(t *testing.T) {
	mnt := runtest.Tmpfs(t, 64<<10)
	_, d := createRun(t, mnt, "full-1")
	if _, err := journal.Append(d, "created", journal.Fields{"pad": strings.Repeat("x", 3000)}, true); err != nil {
		t.Fatal(err)
	}
	filler := runtest.Fill(t, mnt)
	// Append until the space left in the journal's last block is gone too.
	var failed error
	for i := 0; i < 100 && failed == nil; i++ {
		_, failed = journal.Append(d, "signal_sent", journal.Fields{"pad": strings.Repeat("y", 700)}, true)
	}
	if !errors.Is(failed, unix.ENOSPC) {
		t.Fatalf("appends on a full file system: %v, want ENOSPC", failed)
	}
	verify := func(when string) int {
		n, err := journal.Verify(bytes.NewReader(events(t, d)))
		if err != nil {
			t.Fatalf("%s: journal does not verify: %v (a torn line left behind by a failed append)", when, err)
		}
		return n
	}
	n := verify("disk full")
	// Space returns: the journal goes on.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := journal.Append(d, "final", nil, true); err != nil {
		t.Fatalf("append after space returned: %v", err)
	}
	if m := verify("space back"); m != n+1 {
		t.Fatalf("journal has %d lines, want %d", m, n+1)
	}
}

// The space the claim reserves (Writer.Reserve) is the journal's own: on a
// file system filled to the last byte afterwards (the job's output), a stop's
// lines (intent, signals, final, a few dozen) still land, and the journal
// verifies. Without the reserve the first of them fails with ENOSPC.
func TestReserveKeepsRoomForAStopOnAFullDisk(t *testing.T) {
	mnt := runtest.Tmpfs(t, 256<<10)
	root, d := createRun(t, mnt, "reserved")
	w, err := journal.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Reserve(); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if _, err := w.Append("created", nil, true); err != nil {
		t.Fatal(err)
	}
	runtest.Fill(t, mnt)
	pad := strings.Repeat("p", 300)
	for i := 0; i < 30; i++ {
		if _, err := journal.Append(d, "signal_sent", journal.Fields{"i": i, "pad": pad}, true); err != nil {
			t.Fatalf("line %d on a full disk: %v (the reserve did not hold)", i+2, err)
		}
	}
	if n, err := journal.Verify(bytes.NewReader(events(t, d))); err != nil || n != 31 {
		t.Fatalf("Verify: %d lines, %v", n, err)
	}
	// And a journal that reserved nothing fails at once: the test's disk is
	// really full.
	if _, err := root.Create("unreserved"); err == nil {
		d2, _ := root.Open("unreserved")
		defer d2.Close()
		if _, err := journal.Append(d2, "created", journal.Fields{"pad": pad}, true); !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("an unreserved journal on the full disk: %v, want ENOSPC", err)
		}
	}
}

// Appends keep the reserve topped up: a run that journals more than the
// first reserve before the disk fills (renewals, agent requests) still has
// room for its stop's lines afterwards.
func TestAppendsKeepTheReserve(t *testing.T) {
	mnt := runtest.Tmpfs(t, 512<<10)
	_, d := createRun(t, mnt, "topped")
	w, err := journal.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Reserve(); err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("r", 1000)
	for i := 0; i < 3*journal.ReserveBytes/1000; i++ { // three reserves' worth
		if _, err := w.Append("lease_renewed", journal.Fields{"pad": pad}, false); err != nil {
			t.Fatal(err)
		}
	}
	runtest.Fill(t, mnt)
	for i := 0; i < 6; i++ {
		if _, err := journal.Append(d, "signal_sent", journal.Fields{"pad": pad}, true); err != nil {
			t.Fatalf("line %d of the stop on a full disk: %v (the reserve was not kept)", i+1, err)
		}
	}
}
