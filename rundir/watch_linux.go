package rundir

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Watcher wakes a waiter when files in a run directory are replaced or
// written (inotify), so commands that wait for a record (cancel, wait,
// logs -f) react at once instead of sleeping between polls. Where inotify
// is unavailable, Wait simply sleeps for its timeout: callers always
// re-check the files after Wait, so a missed event only costs latency.
//
// The watch is one-shot (IN_ONESHOT), re-armed by Wait before it returns:
// a change after the re-arm raises an event, a change before it is seen by
// the caller's next read. So a job writing its log in many small writes
// pays for one event per wake-up of the waiter, not one per write.
type Watcher struct {
	fd   int
	path string
	buf  []byte
}

const watchMask = unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_DELETE_SELF | unix.IN_CREATE | unix.IN_ONESHOT

// Watch starts watching the directory for replaced, written and removed
// files.
func (d *Dir) Watch() *Watcher {
	// The descriptor's /proc link names the directory we opened, whatever
	// happens to its path.
	w := &Watcher{fd: -1, path: fmt.Sprintf("/proc/self/fd/%d", d.fd), buf: make([]byte, 4096)}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return w
	}
	w.fd = fd
	w.arm()
	return w
}

// arm (re)adds the one-shot watch; if that fails, Wait falls back to
// sleeping for its timeout.
func (w *Watcher) arm() {
	if w.fd < 0 {
		return
	}
	if _, err := unix.InotifyAddWatch(w.fd, w.path, watchMask); err != nil {
		w.Close()
	}
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
			break
		}
	}
	w.arm()
}

// Close stops watching.
func (w *Watcher) Close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}
