package rundir

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
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

// Replaced watches the directory for name being replaced by a rename (how
// every file of a run is rewritten): it returns a channel that receives,
// coalesced, once after each such replacement (and after an overflow of the
// event queue, when no one can tell what was replaced), and a stop func.
// The watch is read through the runtime's poller, so a waiting goroutine
// holds no thread. Without inotify it returns the error, and the caller
// looks for itself.
func (d *Dir) Replaced(name string) (<-chan struct{}, func(), error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, nil, os.NewSyscallError("inotify_init1", err)
	}
	if _, err := unix.InotifyAddWatch(fd, fmt.Sprintf("/proc/self/fd/%d", d.fd), unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, nil, os.NewSyscallError("inotify_add_watch", err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: the poller waits on it
	c := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return // stopped
			}
			if replacedIn(buf[:n], name) {
				select {
				case c <- struct{}{}:
				default: // one is pending already
				}
			}
		}
	}()
	return c, func() { f.Close() }, nil
}

// replacedIn reports whether the inotify events in b name name, or report
// an overflow of the queue.
func replacedIn(b []byte, name string) bool {
	for len(b) >= unix.SizeofInotifyEvent {
		mask := binary.NativeEndian.Uint32(b[4:8])
		n := int(binary.NativeEndian.Uint32(b[12:16]))
		end := unix.SizeofInotifyEvent + n
		if end > len(b) {
			return true // torn: look anyway
		}
		if mask&unix.IN_Q_OVERFLOW != 0 || string(bytes.TrimRight(b[unix.SizeofInotifyEvent:end], "\x00")) == name {
			return true
		}
		b = b[end:]
	}
	return false
}
