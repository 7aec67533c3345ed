//go:build darwin || freebsd

package transport

import (
	"os"

	"golang.org/x/sys/unix"
)

// awaitExit blocks until the child pid has exited, without reaping it: a
// kqueue EVFILT_PROC NOTE_EXIT event (Go offers no waitid(WNOWAIT) here
// without cgo). pid is an unreaped child of this process, so its number is
// its own until Go's Wait reaps it. Registering for a process that has
// exited fails with ESRCH (macOS: it finds no zombie) or fires at once
// (FreeBSD). macOS documents no ordering between a process's exit and a
// registration made while it exits, so the knote is registered afresh
// each second: a late registration is answered then. Any other error makes
// the caller signal the client alone, through os.Process.
func awaitExit(pid int) error {
	kq, err := unix.Kqueue()
	if err != nil {
		return os.NewSyscallError("kqueue", err)
	}
	defer unix.Close(kq)
	change := make([]unix.Kevent_t, 1)
	got := make([]unix.Kevent_t, 1)
	second := unix.NsecToTimespec(1e9)
	for {
		unix.SetKevent(&change[0], pid, unix.EVFILT_PROC, unix.EV_ADD|unix.EV_ONESHOT)
		change[0].Fflags = unix.NOTE_EXIT
		if _, err := unix.Kevent(kq, change, nil, nil); err == unix.ESRCH {
			return nil
		} else if err != nil && err != unix.EINTR {
			return os.NewSyscallError("kevent", err)
		}
		n, err := unix.Kevent(kq, nil, got, &second)
		switch {
		case err == nil && n > 0:
			return nil
		case err != nil && err != unix.EINTR:
			return os.NewSyscallError("kevent", err)
		}
		unix.SetKevent(&change[0], pid, unix.EVFILT_PROC, unix.EV_DELETE)
		_, _ = unix.Kevent(kq, change, nil, nil)
	}
}
