package proc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ReadStat reads /proc/PID/stat. A missing process is ErrGone.
func ReadStat(pid int) (Stat, error) {
	var buf [1024]byte
	return readStat(pid, buf[:])
}

func readStat(pid int, buf []byte) (Stat, error) {
	var pb [32]byte
	path := string(append(strconv.AppendInt(append(pb[:0], "/proc/"...), int64(pid), 10), "/stat"...))
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
		}
		return Stat{}, &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil {
		if err == unix.ESRCH {
			return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
		}
		return Stat{}, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return ParseStat(buf[:n])
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
func Scan() ([]Stat, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]Stat, 0, len(names))
	buf := make([]byte, 1024)
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		s, err := readStat(pid, buf)
		if err != nil {
			continue // gone, or unreadable: not ours to judge
		}
		out = append(out, s)
	}
	return out, nil
}

// BootID returns this boot's ID from /proc/sys/kernel/random/boot_id. It
// is read once per process (a process never outlives its boot) and kept;
// a failed read is not kept, so the next call tries again. Commands that
// judge every run of a root compare it with each record.
func BootID() (string, error) {
	if id := bootID.Load(); id != nil {
		return *id, nil
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
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
