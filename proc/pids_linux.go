package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// What a process's watcher needs to tell, without reading the whole of
// /proc, whether anything could have changed since its last look: the last
// PID the kernel handed out (no new process exists while it stays the same)
// and how long a process has run (a process that has not run has not
// forked, exited or left its group). Each reads one small file into a
// buffer on the stack: a wrapper asks them every second for as long as its
// run lives, and they leave no garbage behind.

// LastPID returns the PID the kernel handed out last in this process's PID
// namespace (/proc/sys/kernel/ns_last_pid, Linux 3.3), a thread's ID
// included: PIDs and thread IDs come from one counter, which counts up to
// PIDMax and then starts again from the bottom.
func LastPID() (int, error) {
	var buf [32]byte
	n, err := readStart("/proc/sys/kernel/ns_last_pid", buf[:])
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(string(bytes.TrimSpace(buf[:n])))
	if err != nil {
		return 0, fmt.Errorf("/proc/sys/kernel/ns_last_pid: %q: %v", string(buf[:n]), err) // a copy: buf stays on the stack
	}
	return v, nil
}

// LastPIDFile is LastPID for a caller that asks again and again: it keeps
// ns_last_pid open and reads it from offset 0 each time (a sysctl file
// answers each such read anew), one pread(2) instead of an open, a read
// and a close. Its zero value reads through LastPID.
type LastPIDFile struct{ fd int }

// OpenLastPID opens ns_last_pid for LastPIDFile.Read.
func OpenLastPID() (*LastPIDFile, error) {
	const path = "/proc/sys/kernel/ns_last_pid"
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &LastPIDFile{fd: fd}, nil
}

// Read returns the last PID handed out, as LastPID does.
func (f *LastPIDFile) Read() (int, error) {
	if f == nil || f.fd <= 0 {
		return LastPID()
	}
	var buf [32]byte
	n, err := unix.Pread(f.fd, buf[:], 0)
	if err != nil {
		return 0, &os.PathError{Op: "read", Path: "/proc/sys/kernel/ns_last_pid", Err: err}
	}
	v, err := strconv.Atoi(string(bytes.TrimSpace(buf[:n])))
	if err != nil {
		return 0, fmt.Errorf("/proc/sys/kernel/ns_last_pid: %q: %v", string(buf[:n]), err) // a copy: buf stays on the stack
	}
	return v, nil
}

// Close closes the file; Read then reads through LastPID.
func (f *LastPIDFile) Close() error {
	if f == nil || f.fd <= 0 {
		return nil
	}
	fd := f.fd
	f.fd = 0
	return unix.Close(fd)
}

// PIDMax returns /proc/sys/kernel/pid_max: PIDs are below it.
func PIDMax() (int, error) {
	var buf [32]byte
	n, err := readStart("/proc/sys/kernel/pid_max", buf[:])
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(string(bytes.TrimSpace(buf[:n])))
	if err != nil || v <= 1 {
		return 0, fmt.Errorf("/proc/sys/kernel/pid_max: %q: not a PID limit", buf[:n])
	}
	return v, nil
}

// RunTime is how long a thread has run on a CPU, and in how many
// timeslices, from /proc/PID/schedstat (or /proc/PID/task/TID/schedstat).
// Any run at all changes it: a thread whose RunTime is the same at two
// looks did nothing in between.
type RunTime struct {
	NS     uint64 // time on a CPU, in nanoseconds
	Slices uint64 // timeslices run
}

// ReadRunTime reads /proc/PID/schedstat: the run time of pid's main thread
// alone (a thread of its own has its own). A missing process is ErrGone. A
// kernel that keeps no schedstat (CONFIG_SCHED_INFO off, or schedstats
// disabled) gives zeros, which RunTimeKept tells.
func ReadRunTime(pid int) (RunTime, error) {
	var pb [48]byte // with room for the NUL readRunTime appends
	path := append(strconv.AppendInt(append(pb[:0], "/proc/"...), int64(pid), 10), "/schedstat"...)
	return readRunTime(pid, path)
}

// ReadThreadRunTime reads /proc/PID/task/TID/schedstat.
func ReadThreadRunTime(pid, tid int) (RunTime, error) {
	var pb [64]byte
	path := append(strconv.AppendInt(append(pb[:0], "/proc/"...), int64(pid), 10), "/task/"...)
	path = append(strconv.AppendInt(path, int64(tid), 10), "/schedstat"...)
	return readRunTime(pid, path)
}

func readRunTime(pid int, path []byte) (RunTime, error) {
	var buf [96]byte
	n, err := readStartNUL(append(path, 0), buf[:])
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return RunTime{}, goneError(pid)
		}
		return RunTime{}, &os.PathError{Op: "read", Path: string(path), Err: err}
	}
	// The error copies path and buf: handing the buffers themselves to
	// fmt would move them to the heap on every call, not just this one.
	f, k := statFields(buf[:n])
	if k < 3 {
		return RunTime{}, fmt.Errorf("%s: %q: want three numbers", string(path), string(buf[:n]))
	}
	ns, err1 := strconv.ParseUint(string(f[0]), 10, 64)
	sl, err2 := strconv.ParseUint(string(f[2]), 10, 64)
	if err1 != nil || err2 != nil {
		return RunTime{}, fmt.Errorf("%s: %q: want three numbers", string(path), string(buf[:n]))
	}
	return RunTime{NS: ns, Slices: sl}, nil
}

// RunTimeKept reports whether this kernel keeps run times: this process,
// which is running now, has a run time above zero.
func RunTimeKept() bool {
	rt, err := ReadRunTime(os.Getpid())
	return err == nil && rt.NS > 0
}

// TaskIDs appends to ids the thread IDs of pid (/proc/PID/task) and returns
// them. A missing process is ErrGone.
func TaskIDs(pid int, ids []int) ([]int, error) {
	names, err := readNames("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		if os.IsNotExist(err) {
			return ids, goneError(pid)
		}
		return ids, err
	}
	for _, n := range names {
		if tid, err := strconv.Atoi(n); err == nil {
			ids = append(ids, tid)
		}
	}
	return ids, nil
}

// IsProcess reports whether pid names a process (a thread group's leader)
// rather than one of its other threads: /proc/TID/stat answers for any
// thread ID, though /proc lists only processes. It reads the Tgid line of
// /proc/PID/status. A missing process is ErrGone.
func IsProcess(pid int) (bool, error) {
	var pb [32]byte
	path := string(append(strconv.AppendInt(append(pb[:0], "/proc/"...), int64(pid), 10), "/status"...))
	var buf [512]byte // Tgid is the fourth line
	n, err := readStart(path, buf[:])
	if err != nil {
		if os.IsNotExist(err) || errors.Is(err, unix.ESRCH) {
			return false, goneError(pid)
		}
		return false, err
	}
	b := buf[:n]
	i := bytes.Index(b, []byte("\nTgid:"))
	if i < 0 {
		return false, fmt.Errorf("%s: no Tgid line", path)
	}
	b = b[i+len("\nTgid:"):]
	if j := bytes.IndexByte(b, '\n'); j >= 0 {
		b = b[:j]
	}
	tgid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return false, fmt.Errorf("%s: Tgid: %v", path, err)
	}
	return tgid == pid, nil
}

// readStartNUL is readStart for a path NUL-terminated in the caller's
// buffer, which it does not copy (openRead). Its error is the bare errno,
// for the caller to tell a gone process without allocating.
func readStartNUL(path []byte, buf []byte) (int, error) {
	fd, err := openRead(path)
	if err != nil {
		return 0, err
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	return n, err
}

// readStart reads the start of a small file into buf, in one read.
func readStart(path string, buf []byte) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil {
		return 0, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return n, nil
}
