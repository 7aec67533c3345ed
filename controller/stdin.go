package controller

// The job's stdin (Config.Stdin): the controller's own, byte for byte, end
// of file included, across reattaches.
//
//   - The launch starts the run with `run --stdin pipe`: the host's wrapper
//     holds the one pipe the job reads and counts what it wrote into it.
//     The launch's `attach` and every reattach get `--stdin-from K`, and
//     the ssh client's stdin carries the stream in frames (handoff/stdin.go:
//     data, then an end-of-file frame), so the host tells the controller's
//     EOF from a connection that was lost.
//   - One goroutine reads Config.Stdin into a buffer that keeps the last
//     StdinKeep bytes sent (default 64 MiB, AGENT_WRAP_STDIN_KEEP). Each
//     connection sends from the oldest byte kept (K); the wrapper skips
//     what the job already has. So after a lost connection nothing is lost
//     and nothing is given twice, as long as the host had been given every
//     byte older than K: the bytes in flight when a connection is lost
//     (ssh's window, the pipes' buffers) are far fewer than the bound.
//   - Reading waits while the buffer holds StdinKeep bytes not yet sent:
//     a job that does not read holds its controller's reading, as ssh's
//     does. Bytes already sent are dropped to make room.
//   - Where the host's count is older than K (more than the bound was
//     sent but not taken by the job, then the connection was lost), the
//     stream cannot be resumed without a hole: the host cancels the run
//     with cause stdin_lost (exit 143).
//   - With no Config.Stdin (agent-wrap ssh -n) the job's stdin is /dev/null
//     on the host and nothing is sent.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/agent-wrap/agent-wrap/handoff"
)

// DefaultStdinKeep is how many bytes of the job's stdin the controller
// keeps after sending them, to send again after a lost connection.
const DefaultStdinKeep = 64 << 20

// EnvStdinKeep overrides DefaultStdinKeep: bytes, or a number with K, M or
// G (KiB, MiB, GiB).
const EnvStdinKeep = "AGENT_WRAP_STDIN_KEEP"

// minStdinKeep is the smallest bound taken: one frame's worth.
const minStdinKeep = 4 << 10

// StdinKeepFromEnv reads EnvStdinKeep with getenv: 0 when it is not set
// (Config's default), an error naming the variable when it is not a size.
func StdinKeepFromEnv(getenv func(string) string) (int64, error) {
	v := strings.TrimSpace(getenv(EnvStdinKeep))
	if v == "" {
		return 0, nil
	}
	n, err := parseSize(v)
	if err != nil || n < minStdinKeep {
		return 0, fmt.Errorf("%s=%q: want a size of at least %d bytes (such as 65536, 512K, 64M or 1G)", EnvStdinKeep, v, minStdinKeep)
	}
	return n, nil
}

func parseSize(v string) (int64, error) {
	mult := int64(1)
	switch strings.ToUpper(v[len(v)-1:]) {
	case "K":
		mult = 1 << 10
	case "M":
		mult = 1 << 20
	case "G":
		mult = 1 << 30
	}
	if mult > 1 {
		v = v[:len(v)-1]
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, errors.New("not a size")
	}
	return n * mult, nil
}

// stdinStream is the job's stdin as the controller keeps and sends it.
type stdinStream struct {
	src  io.Reader
	keep int64

	mu      sync.Mutex
	cond    *sync.Cond
	chunks  [][]byte // the bytes [start, end), in order
	start   int64
	end     int64
	pos     int64 // the next byte the current sender sends
	eof     bool  // src ended at end
	readErr error // why src ended, when not at EOF
	cur     *stdinSender
	reading sync.Once
}

func newStdinStream(src io.Reader, keep int64) *stdinStream {
	if keep <= 0 {
		keep = DefaultStdinKeep
	}
	s := &stdinStream{src: src, keep: keep}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// read is the one goroutine that reads src.
func (s *stdinStream) read() {
	buf := make([]byte, chunkSize)
	for {
		s.mu.Lock()
		for s.end-s.start >= s.keep && s.pos <= s.start {
			s.cond.Wait() // full of bytes not yet sent
		}
		s.mu.Unlock()
		n, err := s.src.Read(buf)
		s.mu.Lock()
		if n > 0 {
			s.add(buf[:n])
			s.trim()
		}
		if err != nil {
			s.eof = true
			if err != io.EOF {
				s.readErr = err
			}
		}
		s.cond.Broadcast()
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// chunkSize is the size of the buffers the kept bytes live in: small reads
// (a terminal's lines) fill one before the next is made, so the kept bytes
// are a few chunks, not one per read.
const chunkSize = 64 << 10

// add appends p to the kept bytes. Called with mu held. Bytes already kept
// are never written again (a sender may be writing them out unlocked); p
// goes after them, in the last chunk's spare room or a new chunk.
func (s *stdinStream) add(p []byte) {
	s.end += int64(len(p))
	if last := len(s.chunks) - 1; last >= 0 {
		c := s.chunks[last]
		k := min(cap(c)-len(c), len(p))
		s.chunks[last] = append(c, p[:k]...)
		p = p[k:]
	}
	if len(p) > 0 {
		c := make([]byte, len(p), max(len(p), chunkSize))
		copy(c, p)
		s.chunks = append(s.chunks, c)
	}
}

// trim drops the oldest bytes beyond the bound, never one not yet sent.
// Called with mu held.
func (s *stdinStream) trim() {
	for s.end-s.start > s.keep && s.start < s.pos {
		drop := min(s.end-s.start-s.keep, s.pos-s.start, int64(len(s.chunks[0])))
		if drop == int64(len(s.chunks[0])) {
			s.chunks[0] = nil
			s.chunks = s.chunks[1:]
		} else {
			s.chunks[0] = s.chunks[0][drop:]
		}
		s.start += drop
	}
}

// at returns the kept bytes from off to the end of their chunk. Called
// with mu held, start <= off < end. The bytes are never written again, so
// the caller may use them after unlocking.
func (s *stdinStream) at(off int64) []byte {
	o := off - s.start
	for _, c := range s.chunks {
		if o < int64(len(c)) {
			return c[o:]
		}
		o -= int64(len(c))
	}
	return nil
}

// stdinSender is one call's sending of the stream.
type stdinSender struct {
	s       *stdinStream
	from    int64
	stopped bool // guarded by s.mu
	mu      sync.Mutex
	w       io.Closer
}

// sender begins a new connection's sending: from the oldest byte kept,
// the K of its `attach --stdin-from K`. The last sender stops.
func (s *stdinStream) sender() *stdinSender {
	s.reading.Do(func() { go s.read() })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		s.cur.stopped = true
	}
	s.pos = s.start
	snd := &stdinSender{s: s, from: s.start}
	s.cur = snd
	s.cond.Broadcast()
	return snd
}

// run sends frames to w until the stream's end of file is sent (w is then
// closed: the host's attach reads end of file after the frame), a write
// fails, or stop.
func (snd *stdinSender) run(w io.WriteCloser) {
	snd.mu.Lock()
	snd.w = w
	snd.mu.Unlock()
	s := snd.s
	s.mu.Lock()
	stopped := snd.stopped
	s.mu.Unlock()
	if stopped {
		w.Close() // stop came first, before w was known
		return
	}
	for {
		s.mu.Lock()
		for !snd.stopped && s.pos >= s.end && !s.eof {
			s.cond.Wait()
		}
		if snd.stopped {
			s.mu.Unlock()
			return
		}
		if s.pos >= s.end { // and eof
			s.mu.Unlock()
			if handoff.WriteEOF(w) == nil {
				w.Close()
			}
			return
		}
		p := s.at(s.pos)
		s.mu.Unlock()
		if err := handoff.WriteData(w, p); err != nil {
			return
		}
		s.mu.Lock()
		if !snd.stopped {
			s.pos += int64(len(p))
			s.trim()
			s.cond.Broadcast()
		}
		s.mu.Unlock()
	}
}

// stop ends the sending: a write in progress fails, w is closed.
func (snd *stdinSender) stop() {
	s := snd.s
	s.mu.Lock()
	snd.stopped = true
	s.cond.Broadcast()
	s.mu.Unlock()
	snd.mu.Lock()
	if snd.w != nil {
		snd.w.Close()
	}
	snd.mu.Unlock()
}

// pipe is the stdin of one call that carries the stream: prefix (the
// gateways' secrets) and then snd's frames. done closes both ends once
// the call is over (after snd.stop).
func (snd *stdinSender) pipe(prefix []byte) (stdin *os.File, done func(), err error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	go func() {
		if len(prefix) > 0 {
			if _, err := pw.Write(prefix); err != nil {
				pw.Close()
				return
			}
		}
		snd.run(pw)
	}()
	return pr, func() { pw.Close(); pr.Close() }, nil
}

// stdinSender begins a call's sending of the stream, and returns the
// words that tell the host's attach where it starts; nil, nil without a
// stream (-n).
func (r *Run) stdinSender() (*stdinSender, []string) {
	if r.in == nil {
		return nil, nil
	}
	snd := r.in.sender()
	return snd, []string{"--stdin-from", strconv.FormatInt(snd.from, 10)}
}

// stdinWords are the host's `run` flags for the job's stdin.
func (r *Run) stdinWords() []string {
	if r.in == nil {
		return nil // the detached run's default: /dev/null
	}
	return []string{"--stdin", "pipe"}
}
