package stop

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// pinned is a process held by a pidfd (Linux 5.3) after its identity was
// checked: its exit is seen the moment it happens, whoever its parent is.
// Cancel waits on the wrapper this way rather than with a file watch: an
// inotify descriptor that has held a mark costs an RCU grace period (5-25
// ms measured here) when it is closed, which is at the end of every
// short-lived command.
type pinned struct {
	fd int
}

// errNoPidfd: the kernel has no pidfd_open (before Linux 5.3).
var errNoPidfd = errors.New("pidfd_open is not available")

// pin opens a pidfd on the process recorded as id and checks its identity.
// A process that is gone is proc.ErrGone; one that no longer matches is an
// error from Identity.Check; without pidfds pin fails, and the caller falls
// back to watching files.
func pin(id proc.Identity) (*pinned, error) {
	if !havePidfd() {
		return nil, errNoPidfd
	}
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		if err == unix.ESRCH {
			return nil, proc.ErrGone
		}
		return nil, os.NewSyscallError("pidfd_open", err)
	}
	s, err := proc.ReadStat(id.PID)
	if err == nil {
		err = id.Check(s)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &pinned{fd: fd}, nil
}

// wait blocks until the process has exited (it is then at least a zombie)
// or timeout has passed, and reports whether it has exited.
func (p *pinned) wait(timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for {
		ms := int((time.Until(end) + time.Millisecond - 1) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

func (p *pinned) close() { unix.Close(p.fd) }
