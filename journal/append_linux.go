package journal

import (
	"bytes"
	"fmt"
	"io"
	"os"
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

// Append adds one event to the run's journal. With sync set, the line is
// fsynced before Append returns (the file exists from the run's creation, so
// its directory entry is already durable). Append returns the entry's seq.
// A write that fails part-way (ENOSPC) is cut back off: no torn line stays.
func Append(d *rundir.Dir, event string, f Fields, sync bool) (int64, error) {
	file, err := d.OpenFile(rundir.EventsFile, unix.O_RDWR|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	defer file.Close()
	for {
		err = unix.Flock(int(file.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return 0, &os.PathError{Op: "flock", Path: file.Name(), Err: err}
	}
	seq, prev, err := tail(file)
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", file.Name(), err)
	}
	at, mono := now()
	line, err := encode(seq+1, at, mono, event, f, prev)
	if err != nil {
		return 0, err
	}
	line = append(line, '\n')
	st, err := file.Stat()
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	if _, err := file.Write(line); err != nil {
		// A full file system can take part of the line before it fails
		// (ENOSPC): cut it off again, under the lock, so the journal never
		// keeps a torn line that would block every later append.
		_ = file.Truncate(st.Size())
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	if sync {
		if err := file.Sync(); err != nil {
			return 0, fmt.Errorf("journal %s: %w", event, err)
		}
	}
	return seq + 1, nil
}

// tail returns the seq and hash of the last line of the journal (0, "" when
// empty). A last line without a newline is a torn write: it is refused, so
// no new line is ever chained to half a line.
func tail(f *os.File) (int64, string, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, "", err
	}
	size := st.Size()
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
