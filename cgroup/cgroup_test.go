package cgroup

import (
	"os"
	"testing"
)

// Mount's statfs of the well-known places finds the mount that the mount
// table names, where the host has cgroup2 at all.
func TestMountAgreesWithMountinfo(t *testing.T) {
	want, err := readMount()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no cgroup2 mount on this host: %v", err)
		}
		t.Skipf("no cgroup2 mount on this host: %v", err)
	}
	mounted.Store(nil)
	got, err := Mount()
	if err != nil || got != want {
		t.Fatalf("Mount() = %q, %v; /proc/self/mountinfo names %q", got, err, want)
	}
	if again, _ := Mount(); again != got {
		t.Fatalf("second Mount() = %q, want %q", again, got)
	}
}
