package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// Descendants returns the processes below pid that are alive (not zombies),
// from one read of /proc. A process reparented away from pid's tree (to
// PID 1) is not a descendant any more.
func Descendants(pid int) ([]proc.Stat, error) {
	all, err := proc.Scan()
	if err != nil {
		return nil, err
	}
	children := map[int][]proc.Stat{}
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var out []proc.Stat
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			queue = append(queue, c.PID)
			if !c.Dead() {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// CountComm counts the processes in ps whose comm is name.
func CountComm(ps []proc.Stat, name string) int {
	n := 0
	for _, p := range ps {
		if p.Comm == name {
			n++
		}
	}
	return n
}

// VmHWM returns the peak resident set size of pid in bytes, from
// /proc/PID/status. A zombie has no VmHWM line: an error.
func VmHWM(pid int) (int64, error) { return StatusBytes(pid, "VmHWM") }

// StatusBytes returns a "kB" field of /proc/PID/status (VmHWM, VmRSS,
// RssAnon, RssFile ...) in bytes.
func StatusBytes(pid int, field string) (int64, error) {
	return procBytes(pid, "status", field)
}

// RollupBytes returns a "kB" field of /proc/PID/smaps_rollup (Pss,
// Private_Clean, Private_Dirty ...) in bytes: Pss charges each shared page
// to the processes that map it in equal parts, so the Pss of N wrappers
// added up is what they cost the host together.
func RollupBytes(pid int, field string) (int64, error) {
	return procBytes(pid, "smaps_rollup", field)
}

func procBytes(pid int, file, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + file)
	if err != nil {
		return 0, err
	}
	prefix := []byte(field + ":")
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, prefix) {
			continue
		}
		f := bytes.Fields(line[len(prefix):])
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("/proc/%d/%s: odd %s line %q", pid, file, field, line)
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/%s: %v", pid, file, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc/%d/%s: no %s (a zombie?)", pid, file, field)
}

// Pidfd is a process pinned by a pidfd (Linux 5.3): its exit is seen the
// moment it becomes a zombie, whoever its parent is, and a recycled PID can
// never be mistaken for it.
type Pidfd struct {
	PID int
	fd  int
}

// OpenPidfd pins pid. When start is not zero the process must have that
// start time (clock ticks since boot), checked after the pin.
func OpenPidfd(pid int, start uint64) (*Pidfd, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, os.NewSyscallError("pidfd_open", err)
	}
	if start != 0 {
		st, err := proc.ReadStat(pid)
		if err != nil || st.Start != start {
			unix.Close(fd)
			if err == nil {
				err = fmt.Errorf("pid %d started at tick %d, not %d", pid, st.Start, start)
			}
			return nil, err
		}
	}
	return &Pidfd{PID: pid, fd: fd}, nil
}

// Wait blocks until the process has exited or timeout passes, and returns
// the time its exit was seen.
func (p *Pidfd) Wait(timeout time.Duration) (time.Time, error) {
	end := time.Now().Add(timeout)
	for {
		left := time.Until(end)
		if left < 0 {
			return time.Time{}, fmt.Errorf("pid %d: %w after %v", p.PID, ErrTimeout, timeout)
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return time.Time{}, os.NewSyscallError("poll", err)
		}
		if n > 0 {
			return time.Now(), nil
		}
	}
}

// Signal sends sig through the pidfd.
func (p *Pidfd) Signal(sig unix.Signal) error {
	return os.NewSyscallError("pidfd_send_signal", unix.PidfdSendSignal(p.fd, sig, nil, 0))
}

// Close releases the pidfd; closing twice is safe.
func (p *Pidfd) Close() error {
	if p.fd < 0 {
		return nil
	}
	fd := p.fd
	p.fd = -1
	return unix.Close(fd)
}
