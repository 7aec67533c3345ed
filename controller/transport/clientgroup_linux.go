package transport

import (
	"os"

	"golang.org/x/sys/unix"
)

// awaitExit blocks until the child pid has exited, without reaping it:
// waitid(P_PID, WEXITED|WNOWAIT) (Linux 2.6.9). pid is an unreaped child
// of this process, so its number is its own until Go's Wait reaps it.
// Any error (ECHILD: it was reaped already, which nothing here does) makes
// the caller signal the client alone, through os.Process.
func awaitExit(pid int) error {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return os.NewSyscallError("waitid", err)
		}
	}
}
