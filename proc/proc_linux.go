package proc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ReadStat reads /proc/PID/stat. A missing process is ErrGone.
func ReadStat(pid int) (Stat, error) {
	var buf [1024]byte
	return readStat(pid, buf[:])
}

func readStat(pid int, buf []byte) (Stat, error) {
	var pb [32]byte
	path := append(strconv.AppendInt(append(pb[:0], "/proc/"...), int64(pid), 10), "/stat\x00"...)
	fd, err := openRead(path)
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return Stat{}, goneError(pid)
		}
		return Stat{}, &os.PathError{Op: "open", Path: string(path[:len(path)-1]), Err: err}
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil {
		if err == unix.ESRCH {
			return Stat{}, goneError(pid)
		}
		return Stat{}, &os.PathError{Op: "read", Path: string(path[:len(path)-1]), Err: err}
	}
	return ParseStat(buf[:n])
}

// openRead opens path, NUL-terminated in the caller's buffer, read-only.
// unix.Open would copy the name to the heap first: the looks of a wrapper
// open thousands of /proc files over its life and should leave nothing
// behind.
func openRead(path []byte) (int, error) {
	dirfd := unix.AT_FDCWD
	fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])),
		uintptr(unix.O_RDONLY|unix.O_CLOEXEC), 0, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// ParseStat parses the content of /proc/PID/stat. The command name is in
// parentheses and may itself contain spaces and ')', so fields are counted
// from the last ')'. It allocates only the command name: every judge of a
// run reads its wrapper's stat (list reads a thousand of them for a
// thousand live runs), and the wrapper's backstop scan reads its members'
// every second.
func ParseStat(b []byte) (Stat, error) {
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 1 || closing < open {
		return Stat{}, fmt.Errorf("parse /proc stat: no command name in %q", string(truncate(b)))
	}
	var s Stat
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc stat: pid: %v", err)
	}
	if pid <= 0 {
		return Stat{}, fmt.Errorf("parse /proc stat: pid %d is not positive", pid)
	}
	s.PID = pid
	// f[0] is field 3 (state); starttime is field 22, so f[19].
	f, n := statFields(b[closing+1:])
	if n < len(f) || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("parse /proc stat: %d fields after the command name, want at least 20", n)
	}
	s.State = f[0][0]
	if !(s.State >= 'A' && s.State <= 'Z' || s.State >= 'a' && s.State <= 'z') {
		return Stat{}, fmt.Errorf("parse /proc stat: state %q is not a letter", s.State)
	}
	ints := [...]*int{&s.PPID, &s.PGID, &s.SID}
	for i, p := range ints {
		v, err := strconv.Atoi(string(f[1+i]))
		if err != nil {
			return Stat{}, fmt.Errorf("parse /proc stat: field %d: %v", 4+i, err)
		}
		*p = v
	}
	if s.Threads, err = strconv.Atoi(string(f[17])); err != nil {
		return Stat{}, fmt.Errorf("parse /proc stat: num_threads: %v", err)
	}
	if s.Start, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
		return Stat{}, fmt.Errorf("parse /proc stat: starttime: %v", err)
	}
	s.Comm = string(b[open+1 : closing])
	return s, nil
}

// statFields returns the first len(f) fields of b, separated by ASCII
// white space (the kernel writes the fields after the command name in
// ASCII, one space apart), and how many it found (at most len(f)).
func statFields(b []byte) (f [20][]byte, n int) {
	for i := 0; i < len(b) && n < len(f); {
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		j := i
		for j < len(b) && !isSpace(b[j]) {
			j++
		}
		if j > i {
			f[n] = b[i:j]
			n++
		}
		i = j
	}
	return f, n
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func truncate(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// Scan reads the stat of every process in /proc. Processes that exit while
// it reads are left out.
func Scan() ([]Stat, error) { return ScanInto(nil, nil) }

// ScanInto is Scan for a caller that scans again and again (a wrapper's
// tracker): it appends to dst[:0] only the processes keep accepts (all of
// them when keep is nil), reads /proc's entries with getdents into a
// buffer on its stack, and allocates nothing but each process's command
// name and dst's growth. A process that never collects its garbage keeps
// what it allocated: a table and the names of every process on a busy
// host, at each whole look, would be most of its heap.
func ScanInto(dst []Stat, keep func(Stat) bool) ([]Stat, error) {
	out := dst[:0]
	fd, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return out, &os.PathError{Op: "open", Path: "/proc", Err: err}
	}
	defer unix.Close(fd)
	var dents [4096]byte
	var buf [1024]byte
	for {
		n, err := unix.Getdents(fd, dents[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return out, &os.PathError{Op: "getdents", Path: "/proc", Err: err}
		}
		if n <= 0 {
			return out, nil
		}
		// struct linux_dirent64: ino (8), off (8), reclen (2), type (1),
		// then the name, NUL-terminated.
		for b := dents[:n]; len(b) > 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen <= 19 || reclen > len(b) {
				break
			}
			pid := pidName(b[19:reclen])
			b = b[reclen:]
			if pid <= 0 {
				continue
			}
			s, err := readStat(pid, buf[:])
			if err != nil {
				continue // gone, or unreadable: not ours to judge
			}
			if keep == nil || keep(s) {
				out = append(out, s)
			}
		}
	}
}

// pidName is the PID a /proc entry's NUL-terminated name spells, or 0 when
// it is not a number (self, sys, ...).
func pidName(name []byte) int {
	pid := 0
	for _, c := range name {
		if c == 0 {
			break
		}
		if c < '0' || c > '9' || pid > 1<<30 {
			return 0
		}
		pid = pid*10 + int(c-'0')
	}
	return pid
}

// BootID returns this boot's ID from /proc/sys/kernel/random/boot_id. It
// is read once per process (a process never outlives its boot) and kept;
// a failed read is not kept, so the next call tries again. Commands that
// judge every run of a root compare it with each record.
func BootID() (string, error) {
	if id := bootID.Load(); id != nil {
		return *id, nil
	}
	// Read with readSmall, not os.ReadFile: the runtime's poller would take
	// this /proc/sys file, report it ready and wake its thread, at the start
	// of every wrapper.
	var buf [64]byte
	b, err := readSmall("/proc/sys/kernel/random/boot_id", buf[:])
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	bootID.Store(&id)
	return id, nil
}

var bootID atomic.Pointer[string]

// Cmdline returns the argv of pid (empty for a zombie or kernel thread).
func Cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return []string{}, nil
	}
	return strings.Split(string(b), "\x00"), nil
}

// SignalName returns "TERM" for SIGTERM and so on, without the SIG prefix.
func SignalName(sig unix.Signal) string {
	n := unix.SignalName(sig)
	if n == "" {
		return strconv.Itoa(int(sig))
	}
	return strings.TrimPrefix(n, "SIG")
}

// Children returns the PIDs of pid's live and zombie children, from
// /proc/PID/task/TID/children of each of its threads (a child belongs to
// the thread that forked it, or to whichever thread an orphan was
// reparented to). ok is false when the kernel has no such files
// (CONFIG_PROC_CHILDREN unset): the caller then reads the whole table with
// Scan. A process that is gone has no children. The lists of two threads
// are not read at one instant: a child reparented between the two reads
// can be missed, so a caller that must see every child looks twice, or
// asks wait4.
func Children(pid int) (children []int, ok bool) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tids, err := readNames(dir)
	if err != nil {
		return nil, childrenSupported()
	}
	var buf [4096]byte
	for _, tid := range tids {
		b, err := readSmall(dir+"/"+tid+"/children", buf[:])
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && !childrenSupported() {
				return nil, false
			}
			continue // the thread exited
		}
		for _, f := range bytes.Fields(b) {
			if c, err := strconv.Atoi(string(f)); err == nil {
				children = append(children, c)
			}
		}
	}
	return children, true
}

// childrenSupported reports whether /proc/PID/task/TID/children exists
// here, probed once on the caller itself.
func childrenSupported() bool {
	childrenOnce.Do(func() {
		_, err := os.Stat("/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/children")
		childrenOK = err == nil
	})
	return childrenOK
}

var (
	childrenOnce sync.Once
	childrenOK   bool
)

// readNames returns the names in the directory path. The directory is
// opened with open(2) and listed through os.NewFile, which leaves a blocking
// descriptor out of the runtime's poller: os.Open would try the poller
// (a fcntl, an epoll_ctl refused with EPERM, two fcntl back), four system
// calls more for each look at a process's threads.
func readNames(path string) ([]string, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	d := os.NewFile(uintptr(fd), path)
	defer d.Close()
	return d.Readdirnames(-1)
}

// readSmall reads a /proc file into buf, growing it when it is full.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b := buf[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// Descendants returns the stats of every process below pid, parents
// before their children. It follows Children down the tree (a few reads
// per process of the tree, none for the rest of the host); where the
// kernel has no children files it reads the whole table (Scan) and follows
// the parent links. A process that exits during the walk is left out, and
// so can its children be (they are reparented while the walk passes): one
// walk is a look, not a proof.
func Descendants(pid int) ([]Stat, error) {
	queue, ok := Children(pid)
	if !ok {
		return descendantsByScan(pid)
	}
	var out []Stat
	seen := map[int]bool{}
	var buf [1024]byte
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		if seen[c] {
			continue
		}
		seen[c] = true
		st, err := readStat(c, buf[:])
		if err != nil {
			continue
		}
		out = append(out, st)
		if st.Dead() {
			continue
		}
		more, _ := Children(c)
		queue = append(queue, more...)
	}
	return out, nil
}

func descendantsByScan(pid int) ([]Stat, error) {
	all, err := Scan()
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	byPID := make(map[int]Stat, len(all))
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p.PID)
		byPID[p.PID] = p
	}
	var out []Stat
	seen := map[int]bool{}
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, byPID[c])
				queue = append(queue, c)
			}
		}
	}
	return out, nil
}
