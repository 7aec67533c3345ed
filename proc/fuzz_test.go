//go:build linux

package proc_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/proc"
)

// FuzzParseStat feeds ParseStat arbitrary bytes (seeds: this process's own
// /proc/self/stat, command names with spaces and parentheses, torn lines).
// It must never panic; what it accepts has a positive PID and a state
// letter, and never more fields than the line holds.
func FuzzParseStat(f *testing.F) {
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("42 (a b) c)) S 1 42 42 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0\n"))
	f.Add([]byte("42 (x) Z 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345"))
	f.Add([]byte("42 (x) S 1 42 42"))
	f.Add([]byte("(x) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345"))
	f.Add([]byte("42 x) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345"))
	f.Add([]byte("-42 (x) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := proc.ParseStat(b)
		if err != nil {
			return
		}
		if s.PID <= 0 {
			t.Fatalf("ParseStat(%q) accepted pid %d", b, s.PID)
		}
		if !(s.State >= 'A' && s.State <= 'Z' || s.State >= 'a' && s.State <= 'z') {
			t.Fatalf("ParseStat(%q) accepted state %q", b, s.State)
		}
	})
}

// FuzzParseStatRoundTrip builds a stat line the way the kernel does, with a
// fuzzed command name (which may hold spaces, parentheses and newlines), and
// requires every field back unchanged.
func FuzzParseStatRoundTrip(f *testing.F) {
	f.Add(42, "sleep", byte('S'), 1, 42, 42, uint64(12345))
	f.Add(7, "a) b (c", byte('Z'), 1, 7, 7, uint64(0))
	f.Add(7, ")", byte('R'), 0, 7, 1, uint64(1<<63))
	f.Add(7, "x\ny", byte('t'), 0, 7, 1, uint64(9))
	f.Fuzz(func(t *testing.T, pid int, comm string, state byte, ppid, pgid, sid int, start uint64) {
		if pid <= 0 || !(state >= 'A' && state <= 'Z' || state >= 'a' && state <= 'z') { // the kernel's states are letters
			return
		}
		line := fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, comm, state, ppid, pgid, sid, start)
		s, err := proc.ParseStat([]byte(line))
		if err != nil {
			t.Fatalf("ParseStat(%q): %v", line, err)
		}
		want := proc.Stat{PID: pid, Comm: comm, State: state, PPID: ppid, PGID: pgid, SID: sid, Start: start, Threads: 1}
		if strings.ContainsRune(comm, 0) {
			return
		}
		if s != want {
			t.Fatalf("ParseStat(%q) = %+v, want %+v", line, s, want)
		}
	})
}
