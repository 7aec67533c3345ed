//go:build linux && !race

// Allocation counts are this file's alone: the race detector allocates on
// the code's behalf and changes them, so these tests are built only
// without it (make race runs the rest of the package under it).

package proc

import (
	"os"
	"testing"
)

// TestReadStatAllocs: reading a process's stat allocates its path, the
// kernel's copy of it and its command name, not a buffer or a slice of
// fields: list judges every live run by its wrapper's stat, and the
// wrapper's backstop scan reads its members' every second.
func TestReadStatAllocs(t *testing.T) {
	pid := os.Getpid()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ReadStat(pid); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 {
		t.Fatalf("ReadStat allocates %.0f times a call, want at most 3", allocs)
	}
}
