// Package cgroup gives a run its own cgroup v2 where the host delegates a
// writable subtree to the caller, so a stop can end with cgroup.kill (see
// stop.KillCgroup): a boundary no descendant can leave by setsid or
// double-forking. This package makes, lists and removes cgroups; it never
// signals.
//
// Requirements, probed at run time: a cgroup2 mount (unified or hybrid
// hierarchy), write access to the caller's own cgroup directory (root, or
// a subtree delegated by systemd), clone3 with CLONE_INTO_CGROUP (Linux 5.7)
// to start the job inside the cgroup with no window outside it, and
// cgroup.kill (Linux 5.14) to kill it whole; without cgroup.kill, a stop
// falls back to signalling every PID listed in cgroup.procs. When any of this is
// missing the run falls back to its session and the wrapper's subreaper
// tree, which contain everything but a process that leaves both.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Parent is the directory, below the caller's own cgroup, that holds the
// runs' cgroups.
const Parent = "agent-wrap"

// errUnavailable is returned (wrapped) when no writable cgroup v2 subtree
// is available.
var errUnavailable = errors.New("no writable cgroup v2 subtree")

// mounted is the cgroup2 mount point once Mount has found one: where a
// host mounts cgroup2 does not change under a running process, and a
// command that asks several times (authorize: the caller's cgroup, then the
// run's) reads the mount table once.
var mounted atomic.Pointer[string]

// wellKnown are where hosts mount cgroup2: the unified hierarchy, and the
// hybrid one's cgroup2 part.
var wellKnown = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}

// Mount returns the cgroup2 mount point (found once per process, once it
// has one): the first of the well-known places that statfs says is a
// cgroup2 file system, else the first cgroup2 mount in
// /proc/self/mountinfo. The statfs is a few microseconds; the kernel
// writes the whole mount table out for a read of mountinfo, which cost
// every run about 0.15 ms of CPU at its start.
func Mount() (string, error) {
	if m := mounted.Load(); m != nil {
		return *m, nil
	}
	for _, p := range wellKnown {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			mounted.Store(&p)
			return p, nil
		}
	}
	m, err := readMount()
	if err == nil {
		mounted.Store(&m)
	}
	return m, err
}

func readMount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS
		line := sc.Text()
		i := strings.Index(line, " - ")
		if i < 0 {
			continue
		}
		post := strings.Fields(line[i+3:])
		pre := strings.Fields(line[:i])
		if len(post) > 0 && post[0] == "cgroup2" && len(pre) >= 5 {
			return unescapeMount(pre[4]), nil
		}
	}
	return "", fmt.Errorf("%w: no cgroup2 mount", errUnavailable)
}

func unescapeMount(s string) string {
	// mountinfo escapes space, tab, newline and backslash as \ooo.
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Self returns the caller's cgroup v2 path (relative to the mount), from the
// "0::" line of /proc/self/cgroup.
func Self() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("0::")); ok {
			return string(rest), nil
		}
	}
	return "", fmt.Errorf("%w: not in a cgroup v2 hierarchy", errUnavailable)
}

// Of returns the absolute cgroup v2 directory of pid, from the "0::" line
// of /proc/PID/cgroup, or "" when it cannot be told.
func Of(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if rel, ok := bytes.CutPrefix(l, []byte("0::")); ok {
			mnt, err := Mount()
			if err != nil {
				return ""
			}
			return filepath.Join(mnt, string(rel))
		}
	}
	return ""
}

// Group is one run's cgroup.
type Group struct {
	Path string // absolute directory
	fd   int    // O_PATH|O_DIRECTORY descriptor, for CLONE_INTO_CGROUP
}

// Create makes the run's cgroup, name, below the caller's own cgroup (in its
// Parent directory), and opens it for CLONE_INTO_CGROUP.
func Create(name string) (*Group, error) {
	mnt, err := Mount()
	if err != nil {
		return nil, err
	}
	self, err := Self()
	if err != nil {
		return nil, err
	}
	parent := filepath.Join(mnt, self, Parent)
	if err := unix.Mkdir(parent, 0o755); err != nil && err != unix.EEXIST {
		return nil, fmt.Errorf("%w: mkdir %s: %v", errUnavailable, parent, err)
	}
	path := filepath.Join(parent, name)
	if err := unix.Mkdir(path, 0o755); err != nil {
		return nil, fmt.Errorf("%w: mkdir %s: %v", errUnavailable, path, err)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Rmdir(path)
		return nil, fmt.Errorf("%w: open %s: %v", errUnavailable, path, err)
	}
	return &Group{Path: path, fd: fd}, nil
}

// FD is the descriptor for SysProcAttr.CgroupFD.
func (g *Group) FD() int { return g.fd }

// Close releases the descriptor (the cgroup stays).
func (g *Group) Close() {
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
}

// Valid reports whether path looks like a run cgroup this package made: an
// absolute path inside the cgroup2 mount, in a Parent directory. A path from
// a record is a claim; this keeps cancel from writing cgroup.kill anywhere
// else.
func Valid(path string) bool {
	mnt, err := Mount()
	if err != nil || path == "" || !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false
	}
	rel, err := filepath.Rel(mnt, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	return filepath.Base(filepath.Dir(path)) == Parent
}

// Procs lists the PIDs in the cgroup (not recursive: runs get no children).
// A cgroup that is gone has none.
func Procs(path string) ([]int, error) {
	// Plain syscalls, not os.ReadFile: a cgroup file is pollable, so the os
	// package would register it with the runtime's epoll and remove it
	// again, four more syscalls in a read the wrapper's backstop makes
	// every second.
	name := path + "/cgroup.procs"
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT {
			return nil, nil
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var small [512]byte
	b := small[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err == unix.ENODEV || err == unix.ENOENT {
				return nil, nil // removed while we read: nothing is in it
			}
			return nil, &os.PathError{Op: "read", Path: name, Err: err}
		}
		if n == 0 {
			break
		}
		b = b[:len(b)+n]
	}
	var out []int
	for _, f := range bytes.Fields(b) {
		if v, err := strconv.Atoi(string(f)); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// Remove deletes the cgroup; it fails (EBUSY) while a process is in it.
func Remove(path string) error {
	err := unix.Rmdir(path)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "rmdir", Path: path, Err: err}
	}
	return nil
}

// Populated reports whether any live process is in the cgroup at path or
// below it, from the "populated" line of its cgroup.events, which the
// kernel keeps exact: it is 1 from the moment a process enters until the
// last one has exited (a zombie does not count). A cgroup that is gone
// holds nothing. It is the one answer to "is the run empty?" that needs no
// look at each process, and a process cannot leave a cgroup by forking.
func Populated(path string) (bool, error) {
	name := path + "/cgroup.events"
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT {
			return false, nil
		}
		return false, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var buf [256]byte
	n, err := unix.Read(fd, buf[:])
	for err == unix.EINTR {
		n, err = unix.Read(fd, buf[:])
	}
	if err != nil {
		if err == unix.ENODEV || err == unix.ENOENT {
			return false, nil
		}
		return false, &os.PathError{Op: "read", Path: name, Err: err}
	}
	for _, line := range bytes.Split(buf[:n], []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("populated ")); ok {
			return string(v) != "0", nil
		}
	}
	return false, fmt.Errorf("%s: no populated line in %q", name, buf[:n])
}
