package journal

import (
	"errors"
	"fmt"
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

// Tail is Tail(d) for the journal this Writer appends to, without opening
// it again: when the file still has the size this Writer's last append
// left (the journal only grows, so no one else appended since), the mark is
// that line's, known without a read; otherwise the last line is read back
// through the Writer's own descriptor.
func (w *Writer) Tail() Mark {
	w.mu.Lock()
	defer w.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(int(w.file.Fd()), &st); err != nil {
		return Mark{}
	}
	if st.Size == w.end {
		return Mark{Seq: w.seq, Hash: w.prev}
	}
	seq, hash, torn, err := tail(w.file, st.Size)
	if err != nil || torn != nil {
		return Mark{}
	}
	return Mark{Seq: seq, Hash: hash}
}

// Close closes the journal's descriptor.
func (w *Writer) Close() error { return w.file.Close() }

// ReserveBytes is the journal space the claim reserves beyond the end of
// events.jsonl (Reserve), and that every append keeps reserved: room for
// the intent, the signals and the final line of a stop, dozens of lines,
// when the job's own output has filled the file system.
const ReserveBytes = 16 << 10

// ErrNoReserve is returned (wrapped, with the cause) by Reserve when the
// journal's space cannot be set aside: the file system is full, or does not
// support fallocate.
var ErrNoReserve = errors.New("cannot reserve journal space")

// Reserve sets aside ReserveBytes beyond the journal's end with
// fallocate(FALLOC_FL_KEEP_SIZE) (Linux 2.6.23; tmpfs 3.5): the blocks are
// the file's, its size does not change, and later appends write into them
// where a full file system would refuse new ones. The claim calls it before
// the job starts, so a full disk cannot silence a stop.
func (w *Writer) Reserve() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(int(w.file.Fd()), &st); err != nil {
		return fmt.Errorf("%w: %w", ErrNoReserve, &os.PathError{Op: "fstat", Path: w.file.Name(), Err: err})
	}
	if err := fallocate(int(w.file.Fd()), st.Size, ReserveBytes); err != nil {
		return fmt.Errorf("%w: %w", ErrNoReserve, &os.PathError{Op: "fallocate", Path: w.file.Name(), Err: err})
	}
	return nil
}

func fallocate(fd int, off, n int64) error {
	for {
		err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err != unix.EINTR {
			return err
		}
	}
}

// Append adds one event. Appends from several processes are serialised with
// flock on the journal file, waited for at most LockWait (a holder that
// keeps it longer is stuck: the append fails, naming it); each reads the journal's current last line
// under that lock (or knows it, see Writer), so seq and prev are always
// right. With sync set, the line is fsynced before Append returns (the file
// exists from the run's creation, so its directory entry is already
// durable). A write that fails part-way (ENOSPC) is cut back off: no torn
// line stays. Append returns the entry's seq.
//
// A last line that is torn (no newline: a writer died mid-line, or the file
// was cut) or does not parse is not chained to and does not block the
// journal: Append ends it with a newline and first writes a journal_torn
// line (fields line, bytes, reason) whose seq follows it and whose prev is
// its hash, so every line after it chains as usual and verify names the torn
// one. Space used by an append is reserved again (ReserveBytes) when less
// than half of it is left.
func (w *Writer) Append(event string, f Fields, sync bool) (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	unlock, err := w.flock()
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	defer unlock()
	return w.appendLocked(event, f, sync)
}

// Locked runs fn holding the journal's lock (waited for at most LockWait,
// as Append waits), so that fn can read the journal and append to it (add,
// Append's work without its lock) with no other writer in between: a line
// appended only if the journal lacks it is appended once.
func (w *Writer) Locked(fn func(add func(event string, f Fields, sync bool) (int64, error)) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	unlock, err := w.flock()
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer unlock()
	return fn(w.appendLocked)
}

// flock takes the journal's lock, waiting at most LockWait.
func (w *Writer) flock() (unlock func(), err error) {
	fd := int(w.file.Fd())
	wait := w.LockWait
	if wait <= 0 {
		wait = rundir.LockWait
	}
	if err := rundir.FlockWithin(fd, w.file.Name(), wait); err != nil {
		return nil, err
	}
	return func() { unix.Flock(fd, unix.LOCK_UN) }, nil
}

// appendLocked is Append under the journal's lock, w.mu held.
func (w *Writer) appendLocked(event string, f Fields, sync bool) (int64, error) {
	file := w.file
	fd := int(file.Fd())
	var err error
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, &os.PathError{Op: "fstat", Path: file.Name(), Err: err})
	}
	size := st.Size
	seq, prev := w.seq, w.prev
	var torn *tornLine
	if size != w.end {
		if seq, prev, torn, err = tail(file, size); err != nil {
			return 0, fmt.Errorf("journal %s: %w", file.Name(), err)
		}
	}
	at, mono := now()
	var out []byte
	if torn != nil {
		if !torn.newline {
			out = append(out, '\n')
		}
		tl, err := encode(torn.line+1, at, mono, "journal_torn", Fields{"line": torn.line, "bytes": len(torn.text), "reason": torn.reason}, Hash(torn.text))
		if err != nil {
			return 0, err
		}
		out = append(append(out, tl...), '\n')
		seq, prev = torn.line+1, Hash(tl)
	}
	line, err := encode(seq+1, at, mono, event, f, prev)
	if err != nil {
		return 0, err
	}
	hash := Hash(line)
	out = append(append(out, line...), '\n')
	if _, err := file.Write(out); err != nil {
		// A full file system can take part of the line before it fails
		// (ENOSPC): cut it off again, under the lock, so the journal never
		// keeps a torn line that would block every later append.
		_ = file.Truncate(size)
		w.end = -1
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	end := size + int64(len(out))
	w.end, w.seq, w.prev = end, seq+1, hash
	if st.Blocks*512-end < ReserveBytes/2 {
		_ = fallocate(fd, end, ReserveBytes) // best effort: a full disk keeps what is left
	}
	if sync {
		if err := file.Sync(); err != nil {
			return 0, fmt.Errorf("journal %s: %w", event, err)
		}
	}
	return seq + 1, nil
}
