package mcpserver

import (
	"os"

	"golang.org/x/sys/unix"
)

// watchParent calls gone once the process that started the server (the
// client: agent-wrap execs agent-wrap-mcp in its own process) has exited,
// even while something else still holds the server's stdin open. It reads
// a pidfd of the parent (Linux 5.3), which polls readable when that
// process exits; the parent is checked again after the pidfd is open, so
// an exit before it is not missed. Without a pidfd (an older kernel), or
// with no parent to watch (PID 1's child), it watches nothing and the end
// of stdin alone says the client is gone.
func watchParent(gone func()) {
	ppid := os.Getppid()
	if ppid <= 1 {
		return
	}
	fd, err := unix.PidfdOpen(ppid, 0)
	if err != nil {
		return
	}
	if os.Getppid() != ppid { // reparented: the parent exited before the pidfd
		unix.Close(fd)
		gone()
		return
	}
	go func() {
		defer unix.Close(fd)
		for {
			// One thread blocked for the server's life: no wakeup until
			// the parent exits.
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
			if err == unix.EINTR {
				continue
			}
			if err == nil && n > 0 {
				gone()
			}
			return
		}
	}()
}
