//go:build linux

package proc

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseStat(t *testing.T) {
	// The command name may hold spaces and parentheses; fields are counted
	// from the last ')'.
	line := "4242 (a) (b c) S 1 4242 4200 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n"
	s, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{PID: 4242, Comm: "a) (b c", State: 'S', PPID: 1, PGID: 4242, SID: 4200, Start: 987654, Threads: 1}
	if s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
	for _, bad := range []string{"", "42", "42 (x) S 1 2", "x (y) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", "1 (y) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
}

func TestReadStatSelf(t *testing.T) {
	s, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	sid, _ := unix.Getsid(0)
	if s.PID != os.Getpid() || s.PPID != os.Getppid() || s.PGID != unix.Getpgrp() || s.SID != sid || s.Start == 0 || s.Dead() {
		t.Fatalf("stat of self: %+v", s)
	}
	if _, err := ReadStat(1 << 30); !errors.Is(err, ErrGone) {
		t.Fatalf("no such pid: %v", err)
	}
}

func TestSignalName(t *testing.T) {
	for sig, want := range map[unix.Signal]string{unix.SIGTERM: "TERM", unix.SIGKILL: "KILL", unix.SIGHUP: "HUP"} {
		if got := SignalName(sig); got != want {
			t.Errorf("SignalName(%d) = %q, want %q", sig, got, want)
		}
	}
}
