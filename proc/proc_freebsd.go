//go:build freebsd && (amd64 || arm64)

package proc

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// struct kinfo_proc (sys/user.h) on FreeBSD's 64-bit ABIs: the offsets of
// the fields ReadStat reads, and the size the kernel reports for the
// record (KINFO_PROC_SIZE). x/sys has no Go type for it.
const (
	kinfoSize   = 1088
	kinfoPID    = 72
	kinfoPPID   = 76
	kinfoPGID   = 80
	kinfoSID    = 88
	kinfoStart  = 336 // struct timeval ki_start: int64 sec, int64 usec
	kinfoStat   = 388 // char ki_stat
	kinfoComm   = 447 // char ki_comm[COMMLEN+1]
	kinfoCommSz = 20
)

// ReadStat reads what FreeBSD keeps of a process (sysctl kern.proc.pid):
// /proc is not mounted there by default. Start is the start time in
// microseconds since the epoch, not clock ticks since boot: it identifies
// a process on this machine just as well, and nothing compares it across
// systems. A missing process is ErrGone.
func ReadStat(pid int) (Stat, error) {
	b, err := unix.SysctlRaw("kern.proc.pid", pid)
	if err != nil {
		if err == unix.ESRCH {
			return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
		}
		return Stat{}, fmt.Errorf("pid %d: sysctl kern.proc.pid: %w", pid, err)
	}
	if len(b) == 0 {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	if len(b) < kinfoSize || binary.LittleEndian.Uint32(b) != kinfoSize {
		return Stat{}, fmt.Errorf("pid %d: sysctl kern.proc.pid: a %d-byte record, not the struct kinfo_proc this build knows", pid, len(b))
	}
	i32 := func(off int) int { return int(int32(binary.LittleEndian.Uint32(b[off:]))) }
	s := Stat{
		PID:   i32(kinfoPID),
		PPID:  i32(kinfoPPID),
		PGID:  i32(kinfoPGID),
		SID:   i32(kinfoSID),
		State: bsdState(int(int8(b[kinfoStat]))),
		Start: binary.LittleEndian.Uint64(b[kinfoStart:])*1e6 + binary.LittleEndian.Uint64(b[kinfoStart+8:]),
	}
	for _, c := range b[kinfoComm : kinfoComm+kinfoCommSz] {
		if c == 0 {
			break
		}
		s.Comm += string(rune(c))
	}
	if s.PID != pid {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	return s, nil
}
