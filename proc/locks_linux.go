package proc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// LockHolders returns the PIDs that hold a lock on the file whose device
// is dev (as stat(2) gives it) and whose inode is ino, from /proc/locks:
// every flock, POSIX and lease lock of the machine, one line each, naming
// the file by major:minor:inode, never by path. A process waiting for a lock
// (a "->" line) is not a holder, nor an open-file-description lock (PID -1,
// not one process's). A PID is listed once.
func LockHolders(dev, ino uint64) ([]int, error) {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil, err
	}
	return parseLocks(b, unix.Major(dev), unix.Minor(dev), ino), nil
}

// parseLocks reads the content of /proc/locks. A line is
// "N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE START END", the device
// numbers in hex; a waiter's line has "->" after "N:".
func parseLocks(b []byte, major, minor uint32, ino uint64) []int {
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, ino)
	var out []int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 6 || string(f[1]) == "->" {
			continue
		}
		if string(f[5]) != want {
			continue
		}
		pid, err := strconv.Atoi(string(f[4]))
		if err != nil || pid <= 0 {
			continue
		}
		dup := false
		for _, p := range out {
			dup = dup || p == pid
		}
		if !dup {
			out = append(out, pid)
		}
	}
	return out
}

// Exe returns the path of the executable pid runs (the target of
// /proc/PID/exe), "" when it cannot be read (a kernel thread, another
// user's process, or one gone).
func Exe(pid int) string {
	p, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return ""
	}
	return p
}
