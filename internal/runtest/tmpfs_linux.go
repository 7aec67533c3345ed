package runtest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs of size bytes (rounded up to pages by the kernel)
// on a new directory and unmounts it when the test ends: a real file
// system a test can fill to the last block, or remount read-only. A test
// that is not root cannot mount, and is skipped; under CI=true it fails.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs the tests as root, to mount a tmpfs")
		}
		t.Skip("needs root to mount a tmpfs")
	}
	mnt, err := os.MkdirTemp("", "aw-tmpfs-")
	if err != nil {
		t.Fatal(err)
	}
	opts := "size=" + strconv.FormatInt(size, 10) + ",mode=0700"
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, opts); err != nil {
		os.Remove(mnt)
		t.Fatalf("mount -t tmpfs -o %s %s: %v", opts, mnt, err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		os.Remove(mnt)
	})
	return mnt
}

// Fill writes zeros to a new file in dir until the file system is full
// (ENOSPC) and returns the file's path; removing it gives the space back.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, ".filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	FillFile(t, f)
	return path
}

// FillFile appends zeros to f until the file system is full, first in
// large pieces, then a byte at a time, so not even a partial block is left.
func FillFile(t testing.TB, f *os.File) {
	t.Helper()
	for _, n := range []int{1 << 20, 4096, 1} {
		chunk := bytes.Repeat([]byte{0}, n)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatalf("filling %s: %v", f.Name(), err)
				}
				break
			}
		}
	}
}

// Remount remounts the file system at mnt read-only (ro) or read-write.
func Remount(t testing.TB, mnt string, ro bool) {
	t.Helper()
	flags := uintptr(unix.MS_REMOUNT)
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", flags, ""); err != nil {
		t.Fatalf("remount %s (read-only %v): %v", mnt, ro, err)
	}
}
