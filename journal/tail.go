package journal

import (
	"bytes"
	"encoding/json"
	"io"
	"os"

	"github.com/agent-wrap/agent-wrap/rundir"
)

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
	file, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
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

// Last returns the last line of the journal in f, whose size is size, that
// parses and whose event is one of events, reading backwards from the end
// in chunks, so a long journal whose line is near its end (a lease's last
// renewal) costs a read or two, not the whole file. ok is false when no
// line matches.
func Last(f io.ReaderAt, size int64, events ...string) (e Entry, ok bool) {
	var want [][]byte
	for _, ev := range events {
		b, _ := json.Marshal(ev)
		want = append(want, append([]byte(`"event":`), b...))
	}
	const chunk = 64 << 10
	var carry []byte // the start of a line whose rest was read before
	for end := size; end > 0; {
		start := max(end-chunk, 0)
		buf := make([]byte, end-start, end-start+int64(len(carry)))
		if _, err := f.ReadAt(buf, start); err != nil && err != io.EOF {
			return Entry{}, false
		}
		buf = append(buf, carry...)
		end = start
		// Every line that begins after the first newline is whole; what
		// precedes it may continue a line that starts in the chunk before.
		first := 0
		if start > 0 {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				carry = buf
				continue
			}
			first = i + 1
			carry = bytes.Clone(buf[:i])
		}
		lines := bytes.Split(buf[first:], []byte{'\n'})
		for i := len(lines) - 1; i >= 0; i-- {
			line := lines[i]
			hit := false
			for _, w := range want {
				hit = hit || bytes.Contains(line, w)
			}
			if !hit {
				continue
			}
			if e, err := ParseLine(line); err == nil {
				for _, ev := range events {
					if e.Event == ev {
						return e, true
					}
				}
			}
		}
		if start == 0 {
			break
		}
	}
	return Entry{}, false
}
