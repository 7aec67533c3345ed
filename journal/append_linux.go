package journal

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/rundir"
)

// now returns the wall clock and CLOCK_BOOTTIME in nanoseconds.
func now() (time.Time, int64) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Now().UTC(), ts.Nano()
}

// Append adds one event to the run's journal, through a descriptor opened
// for this one line (see Writer.Append). It returns the entry's seq.
func Append(d *rundir.Dir, event string, f Fields, sync bool) (int64, error) {
	w, err := Open(d)
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	defer w.Close()
	return w.Append(event, f, sync)
}

// Writer appends to one run's journal through a descriptor it keeps open,
// for a process that journals many events (the wrapper): one open for the
// run, not one per line, and the last line is read back only when another
// process has appended since this Writer's own last line. Its methods may be
// called from several goroutines.
type Writer struct {
	mu   sync.Mutex
	file *os.File
	// After this Writer's last append: the journal's size then, and that
	// line's seq and hash. If the file still has that size under the lock,
	// no one else appended (the journal only grows), and they are its tail.
	end  int64
	seq  int64
	prev string
	// LockWait bounds the wait for the journal's lock (0: rundir.LockWait);
	// a lock still held then fails the append with a *rundir.HeldError
	// naming its holder.
	LockWait time.Duration
}

// Open opens (creating, mode 0600) the run's events.jsonl for appending.
func Open(d *rundir.Dir) (*Writer, error) {
	file, err := d.OpenFile(rundir.EventsFile, unix.O_RDWR|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &Writer{file: file, end: -1}, nil
}

// Close closes the journal's descriptor.
func (w *Writer) Close() error { return w.file.Close() }

// Append adds one event. Appends from several processes are serialised with
// flock on the journal file, waited for at most LockWait (a holder that
// keeps it longer is stuck: the append fails, naming it); each reads the journal's current last line
// under that lock (or knows it, see Writer), so seq and prev are always
// right. With sync set, the line is fsynced before Append returns (the file
// exists from the run's creation, so its directory entry is already
// durable). A write that fails part-way (ENOSPC) is cut back off: no torn
// line stays. Append returns the entry's seq.
func (w *Writer) Append(event string, f Fields, sync bool) (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	file := w.file
	fd := int(file.Fd())
	wait := w.LockWait
	if wait <= 0 {
		wait = rundir.LockWait
	}
	err := rundir.FlockWithin(fd, file.Name(), wait)
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	defer unix.Flock(fd, unix.LOCK_UN)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, &os.PathError{Op: "fstat", Path: file.Name(), Err: err})
	}
	size := st.Size
	seq, prev := w.seq, w.prev
	if size != w.end {
		if seq, prev, err = tail(file, size); err != nil {
			return 0, fmt.Errorf("journal %s: %w", file.Name(), err)
		}
	}
	at, mono := now()
	line, err := encode(seq+1, at, mono, event, f, prev)
	if err != nil {
		return 0, err
	}
	hash := Hash(line)
	line = append(line, '\n')
	if _, err := file.Write(line); err != nil {
		// A full file system can take part of the line before it fails
		// (ENOSPC): cut it off again, under the lock, so the journal never
		// keeps a torn line that would block every later append.
		_ = file.Truncate(size)
		w.end = -1
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	w.end, w.seq, w.prev = size+int64(len(line)), seq+1, hash
	if sync {
		if err := file.Sync(); err != nil {
			return 0, fmt.Errorf("journal %s: %w", event, err)
		}
	}
	return seq + 1, nil
}

// tail returns the seq and hash of the last line of the journal, whose size
// is size (0, "" when empty). A last line without a newline is a torn write: it is refused, so
// no new line is ever chained to half a line.
func tail(f *os.File, size int64) (int64, string, error) {
	if size == 0 {
		return 0, "", nil
	}
	// Read backwards in growing chunks until the chunk holds a whole line.
	chunk := int64(4096)
	for {
		if chunk > size {
			chunk = size
		}
		buf := make([]byte, chunk)
		if _, err := f.ReadAt(buf, size-chunk); err != nil && err != io.EOF {
			return 0, "", err
		}
		if buf[len(buf)-1] != '\n' {
			return 0, "", fmt.Errorf("last line has no newline (a torn write); run 'agent-wrap verify' on the run")
		}
		body := buf[:len(buf)-1]
		i := bytes.LastIndexByte(body, '\n')
		if i >= 0 || chunk == size {
			line := body[i+1:]
			e, err := ParseLine(line)
			if err != nil {
				return 0, "", fmt.Errorf("last line does not parse: %v", err)
			}
			return e.Seq, Hash(line), nil
		}
		chunk *= 4
	}
}
