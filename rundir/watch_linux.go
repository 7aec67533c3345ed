package rundir

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Watcher wakes a waiter when status.json is replaced, or (WatchLogs) when
// files in the run directory are written, or (WatchWrites) when one open
// file is (inotify), so commands that wait for a record (cancel, wait,
// logs -f, attach) and the wrapper's log followers react at once instead of
// sleeping between polls. Callers always re-check the files after Wait, so
// a missed event only costs latency; where inotify is unavailable, Wait
// sleeps for its timeout.
//
// The watch is set up only once the watcher has been waiting for
// WatchAfter: closing an inotify descriptor that has held a mark (or
// exiting with one) waits for an SRCU grace period, 8-12 ms measured here,
// which a command following a run that ends within a second would pay at
// its exit, more than it waits. Until then Wait looks again after 1 ms,
// doubling to 50 ms.
//
// The watch is one-shot (IN_ONESHOT), re-armed by Wait before it returns:
// a change after the re-arm raises an event, a change before it is seen by
// the caller's next read. So a job writing its log in many small writes
// pays for one event per wake-up of the waiter, not one per write.
type Watcher struct {
	fd     int // -1: no watch (not yet, or none to be had)
	path   string
	mask   uint32
	buf    []byte
	after  time.Time     // when the watch is set up
	nap    time.Duration // the next look while there is no watch
	failed bool          // inotify is not to be had: sleep
}

// WatchAfter is how long a Watcher waits by looking before it sets up its
// inotify watch.
const WatchAfter = time.Second

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
func (d *Dir) Watch() *Watcher { return d.watch(recordMask, WatchAfter) }

// WatchLogs starts watching the directory for a replaced record and for
// writes to the logs (logs -f).
func (d *Dir) WatchLogs() *Watcher { return d.watch(logsMask, WatchAfter) }

func (d *Dir) watch(mask uint32, after time.Duration) *Watcher {
	// The descriptor's /proc link names the directory we opened, whatever
	// happens to its path.
	return newWatcher(fmt.Sprintf("/proc/self/fd/%d", d.fd), mask, after)
}

// WatchWrites watches the open file f for writes (a log's follower), its
// watch set up after after (WatchAfter outside tests). The descriptor's
// /proc link names the inode read, whatever happens to its path.
func WatchWrites(f *os.File, after time.Duration) *Watcher {
	return newWatcher(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_ONESHOT, after)
}

func newWatcher(path string, mask uint32, after time.Duration) *Watcher {
	return &Watcher{fd: -1, path: path, mask: mask, after: time.Now().Add(after), nap: time.Millisecond}
}

// Armed reports whether the inotify watch is in place (so every change
// wakes Wait at once).
func (w *Watcher) Armed() bool { return w.fd >= 0 }

// setUp creates the inotify watch once its time has come; if that fails,
// Wait sleeps for its timeout from then on.
func (w *Watcher) setUp() {
	if w.fd >= 0 || w.failed || time.Now().Before(w.after) {
		return
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		w.failed = true
		return
	}
	w.fd, w.buf = fd, make([]byte, 4096)
	w.arm()
}

// arm (re)adds the one-shot watch; if that fails, Wait falls back to
// sleeping for its timeout.
func (w *Watcher) arm() {
	if w.fd < 0 {
		return
	}
	if _, err := unix.InotifyAddWatch(w.fd, w.path, w.mask); err != nil {
		w.Close()
		w.failed = true
	}
}

// Wait blocks until something changed in the directory or timeout passed.
func (w *Watcher) Wait(timeout time.Duration) { w.WaitAlso(timeout, -1) }

// WaitAlso is Wait that also returns when the descriptor also becomes
// readable (a pidfd: its process exited), and reports whether it did. A
// negative also is Wait.
func (w *Watcher) WaitAlso(timeout time.Duration, also int) bool {
	if w.fd < 0 && !w.failed {
		if !time.Now().Before(w.after) {
			// The watch starts now: return at once, so the caller
			// reads what changed before it was in place.
			w.setUp()
			if w.fd >= 0 {
				return false
			}
		} else {
			timeout = min(timeout, w.nap)
			w.nap = min(2*w.nap, 50*time.Millisecond)
		}
	}
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
