package handoff

// The job's stdin, fed over the control socket. A run started with
// `run --stdin pipe` has the one pipe its job reads from held by the
// wrapper, which counts the bytes it wrote into it. A feeder (the host's
// `attach --stdin-from K`, relaying what a controller sends over ssh)
// connects to the control socket and asks with OpStdin, From K: the first
// byte it will send is byte K of the stream. The wrapper answers with its
// count (Reply.Written) and then reads frames:
//
//	'd' uint32(n) n bytes   the stream's next n bytes
//	'e' uint32(0)           the end of the stream (the controller's EOF)
//
// The wrapper skips what the job already has (K <= Written) and writes the
// rest, so a controller that sends again from the oldest byte it kept after
// a lost connection delivers each byte once. A feeder whose K is past the
// wrapper's count would leave a hole in the stream: the wrapper refuses it
// (ReasonStdinGap) and cancels the run with cause stdin_lost. A connection
// that ends without the 'e' frame is a feeder gone, not an end of file; a
// new feeder replaces an old one that is still connected. Once the stream
// has ended (Reply.Closed: the controller's EOF, or the job closed its end)
// no more bytes are taken and no gap is possible.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// OpStdin asks to feed the run's stdin from byte Request.From.
const OpStdin = "stdin"

// Refusals of OpStdin.
const (
	// ReasonNoStdin: the run's stdin is not a pipe the wrapper feeds (it
	// was started without --stdin pipe).
	ReasonNoStdin = "no_stdin"
	// ReasonStdinGap: the feeder starts past the bytes the job was given;
	// the run is cancelled (stdin_lost).
	ReasonStdinGap = "stdin_gap"
	// ReasonReplaced: a newer feeder asked at the same time.
	ReasonReplaced = "replaced"
)

// Why a run's stdin stream has ended (Reply.Closed).
const (
	StdinEOF        = "eof"         // the controller's end of file reached the job
	StdinReaderGone = "reader_gone" // the job closed its end of the pipe
	StdinRunOver    = "run_over"    // the run ended
)

// Frame types.
const (
	frameData = 'd'
	frameEOF  = 'e'
)

// MaxFrame is the largest data frame a reader accepts.
const MaxFrame = 1 << 20

// WriteData writes p as data frames.
func WriteData(w io.Writer, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxFrame)
		var h [5]byte
		h[0] = frameData
		binary.BigEndian.PutUint32(h[1:], uint32(n))
		if _, err := w.Write(h[:]); err != nil {
			return err
		}
		if _, err := w.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// WriteEOF writes the end-of-stream frame.
func WriteEOF(w io.Writer) error {
	_, err := w.Write([]byte{frameEOF, 0, 0, 0, 0})
	return err
}

// ErrBadFrame is a stream that is not a sequence of frames.
var ErrBadFrame = errors.New("handoff: a stdin frame that is not one")

// FrameReader reads the frames of one feeder.
type FrameReader struct {
	r    io.Reader
	left int // bytes of the current data frame not yet read
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Read reads stream bytes into p. It returns io.EOF at the end-of-stream
// frame, and io.ErrUnexpectedEOF when the connection ends without it (the
// feeder went away: more may come from another).
func (f *FrameReader) Read(p []byte) (int, error) {
	for f.left == 0 {
		var h [5]byte
		if _, err := io.ReadFull(f.r, h[:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		n := binary.BigEndian.Uint32(h[1:])
		switch {
		case h[0] == frameEOF && n == 0:
			return 0, io.EOF
		case h[0] != frameData || n > MaxFrame:
			return 0, fmt.Errorf("%w (type %q, length %d)", ErrBadFrame, h[0], n)
		}
		f.left = int(n)
	}
	if len(p) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= n
	if err == io.EOF {
		if f.left > 0 || n == 0 {
			err = io.ErrUnexpectedEOF
		} else {
			err = nil
		}
	}
	return n, err
}

// DialStdin connects to a wrapper's control socket as the feeder of run
// runID's stdin from byte from, and returns the connection to write frames
// to with the wrapper's answer. A refusal is an answer (Reply.OK false,
// Reply.Reason), not an error: the connection is then closed.
func DialStdin(path, runID string, from int64) (net.Conn, Reply, error) {
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return nil, Reply{}, err
	}
	b, err := json.Marshal(Request{Op: OpStdin, RunID: runID, From: from})
	if err != nil {
		conn.Close()
		return nil, Reply{}, err
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(append(b, '\n')); err != nil {
		conn.Close()
		return nil, Reply{}, fmt.Errorf("handoff: stdin: %w", err)
	}
	// One byte at a time: what follows the answer is nothing (the wrapper
	// only answers), but the answer must not be read past.
	var line []byte
	var c [1]byte
	for {
		if _, err := conn.Read(c[:]); err != nil {
			conn.Close()
			return nil, Reply{}, fmt.Errorf("handoff: stdin: no answer from the run's wrapper: %w", err)
		}
		if c[0] == '\n' {
			break
		}
		if line = append(line, c[0]); len(line) > maxLine {
			conn.Close()
			return nil, Reply{}, errors.New("handoff: stdin: an answer longer than 64 KiB")
		}
	}
	_ = conn.SetDeadline(time.Time{})
	var r Reply
	if err := json.Unmarshal(line, &r); err != nil {
		conn.Close()
		return nil, Reply{}, fmt.Errorf("handoff: stdin: an answer that is not one: %v", err)
	}
	if !r.OK {
		conn.Close()
		return nil, r, nil
	}
	return conn, r, nil
}
