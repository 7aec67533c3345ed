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

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// A journal on a full file system: appends fail with ENOSPC, but no torn
// line is ever left behind (the kernel may write part of a line before it
// runs out of space), so the journal still verifies, and once space returns
// appends chain on from the last whole line.
func TestAppendOnFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	root, err := rundir.OpenRoot(filepath.Join(mnt, "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	d, err := root.Create("full-1")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := journal.Append(d, "created", journal.Fields{"pad": strings.Repeat("x", 3000)}, true); err != nil {
		t.Fatal(err)
	}
	// Fill every free block.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{'f'}, 512)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	// Append until the space left in the journal's last block is gone too.
	var failed error
	for i := 0; i < 100 && failed == nil; i++ {
		_, failed = journal.Append(d, "signal_sent", journal.Fields{"pad": strings.Repeat("y", 700)}, true)
	}
	if !errors.Is(failed, unix.ENOSPC) {
		t.Fatalf("appends on a full file system: %v, want ENOSPC", failed)
	}
	verify := func(when string) int {
		b, err := os.ReadFile(filepath.Join(d.Path, rundir.EventsFile))
		if err != nil {
			t.Fatal(err)
		}
		n, err := journal.Verify(bytes.NewReader(b))
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
