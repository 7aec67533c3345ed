package rundir

import (
	"time"

	"golang.org/x/sys/unix"
)

// Watcher wakes a waiter when files in a run directory are replaced or
// written (inotify), so commands that wait for a record (cancel, wait,
// logs -f) react at once instead of sleeping between polls. Where inotify
// is unavailable, Wait simply sleeps for its timeout: callers always
// re-check the files after Wait, so a missed event only costs latency.
type Watcher struct {
	fd  int
	buf []byte
}

// Watch starts watching the directory for replaced, written and removed
// files.
func (d *Dir) Watch() *Watcher {
	w := &Watcher{fd: -1, buf: make([]byte, 4096)}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return w
	}
	if _, err := unix.InotifyAddWatch(fd, d.Path, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_CREATE); err != nil {
		unix.Close(fd)
		return w
	}
	w.fd = fd
	return w
}

// Wait blocks until something changed in the directory or timeout passed.
func (w *Watcher) Wait(timeout time.Duration) {
	if w.fd < 0 {
		time.Sleep(timeout)
		return
	}
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	ms := int(timeout / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	for {
		_, err := unix.Poll(fds, ms)
		if err != unix.EINTR {
			break
		}
	}
	for {
		if _, err := unix.Read(w.fd, w.buf); err != nil {
			return
		}
	}
}

// Close stops watching.
func (w *Watcher) Close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}
