package journal

import (
	"bytes"
	"errors"
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
		return fmt.Errorf("%w: %v", ErrNoReserve, &os.PathError{Op: "fstat", Path: w.file.Name(), Err: err})
	}
	if err := fallocate(int(w.file.Fd()), st.Size, ReserveBytes); err != nil {
		return fmt.Errorf("%w: %v", ErrNoReserve, &os.PathError{Op: "fallocate", Path: w.file.Name(), Err: err})
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
// flock on the journal file; each reads the journal's current last line
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
	file := w.file
	fd := int(file.Fd())
	var err error
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return 0, &os.PathError{Op: "flock", Path: file.Name(), Err: err}
	}
	defer unix.Flock(fd, unix.LOCK_UN)
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

// tornLine is a last line of the journal that cannot be chained to.
type tornLine struct {
	line    int64  // its line number
	text    []byte // its bytes, without a newline
	newline bool   // it ends with one (it is whole, but does not parse)
	reason  string
}

// tail returns the seq and hash of the last line of the journal, whose size
// is size (0, "" when empty), or, when that line is torn or does not parse,
// what Append needs to write past it.
func tail(f *os.File, size int64) (int64, string, *tornLine, error) {
	if size == 0 {
		return 0, "", nil, nil
	}
	// Read backwards in growing chunks until the chunk holds a whole line.
	chunk := int64(4096)
	for {
		if chunk > size {
			chunk = size
		}
		buf := make([]byte, chunk)
		if _, err := f.ReadAt(buf, size-chunk); err != nil && err != io.EOF {
			return 0, "", nil, err
		}
		newline := buf[len(buf)-1] == '\n'
		body := buf
		if newline {
			body = buf[:len(buf)-1]
		}
		i := bytes.LastIndexByte(body, '\n')
		if i >= 0 || chunk == size {
			line := body[i+1:]
			reason := "no trailing newline (a torn write)"
			if newline {
				e, err := ParseLine(line)
				if err == nil {
					return e.Seq, Hash(line), nil, nil
				}
				reason = err.Error()
			}
			n, err := countLines(f, size)
			if err != nil {
				return 0, "", nil, err
			}
			return 0, "", &tornLine{line: n, text: bytes.Clone(line), newline: newline, reason: reason}, nil
		}
		chunk *= 4
	}
}

// countLines counts the lines of the journal's first size bytes, a last
// line without a newline included.
func countLines(f *os.File, size int64) (int64, error) {
	r := io.NewSectionReader(f, 0, size)
	buf := make([]byte, 64<<10)
	var n int64
	var last byte
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(bytes.Count(buf[:k], []byte{'\n'}))
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if size > 0 && last != '\n' {
		n++
	}
	return n, nil
}

// Tail returns the mark of the run's journal as it is now: the seq and hash
// of its last line (zero when it is empty, missing, or its last line is
// torn). A record carries it (statusfile), so that verify can tell a
// journal cut at a line boundary.
func Tail(d *rundir.Dir) Mark {
	file, err := d.OpenFile(rundir.EventsFile, unix.O_RDONLY, 0)
	if err != nil {
		return Mark{}
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return Mark{}
	}
	seq, hash, torn, err := tail(file, fi.Size())
	if err != nil || torn != nil {
		return Mark{}
	}
	return Mark{Seq: seq, Hash: hash}
}
