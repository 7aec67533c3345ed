package rundir

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Watcher wakes a waiter when status.json is replaced, or (WatchLogs) when
// files in the run directory are written (inotify), so commands that wait for a record (cancel, wait,
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
	mask uint32
	buf  []byte
}

// recordMask: status.json is only ever replaced by a rename (IN_MOVED_TO);
// IN_DELETE_SELF ends a wait on a run that gc removed. logsMask adds the
// writes to the logs and the journal.
const (
	recordMask = unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_ONESHOT
	logsMask   = recordMask | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_CREATE
)

// Watch starts watching the directory for a replaced status.json (what
// cancel and wait wait for), so a job's writes to its logs do not wake the
// waiter.
func (d *Dir) Watch() *Watcher { return d.watch(recordMask) }

// WatchLogs starts watching the directory for a replaced record and for
// writes to the logs (logs -f).
func (d *Dir) WatchLogs() *Watcher { return d.watch(logsMask) }

func (d *Dir) watch(mask uint32) *Watcher {
	// The descriptor's /proc link names the directory we opened, whatever
	// happens to its path.
	w := &Watcher{fd: -1, path: fmt.Sprintf("/proc/self/fd/%d", d.fd), mask: mask, buf: make([]byte, 4096)}
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
	if _, err := unix.InotifyAddWatch(w.fd, w.path, w.mask); err != nil {
		w.Close()
	}
}

// Wait blocks until something changed in the directory or timeout passed.
func (w *Watcher) Wait(timeout time.Duration) { w.WaitAlso(timeout, -1) }

// WaitAlso is Wait that also returns when the descriptor also becomes
// readable (a pidfd: its process exited), and reports whether it did. A
// negative also is Wait.
func (w *Watcher) WaitAlso(timeout time.Duration, also int) bool {
	fds := make([]unix.PollFd, 0, 2)
	if w.fd >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(w.fd), Events: unix.POLLIN})
	}
	if also >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(also), Events: unix.POLLIN})
	}
	if len(fds) == 0 {
		time.Sleep(timeout)
		return false
	}
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
	if w.fd >= 0 {
		for {
			if _, err := unix.Read(w.fd, w.buf); err != nil {
				break
			}
		}
		w.arm()
	}
	return also >= 0 && fds[len(fds)-1].Revents != 0
}

// Close stops watching.
func (w *Watcher) Close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}
