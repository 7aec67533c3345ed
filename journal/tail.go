package journal

import (
	"bytes"
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
