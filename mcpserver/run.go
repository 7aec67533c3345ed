package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// liveRun is a run this server started: the controller's Run, followed by
// one goroutine until it is settled, and the job's output as delivered.
type liveRun struct {
	run  *controller.Run
	dest string
	out  *stream // the job's stdout
	errs *stream // the job's stderr

	// launched is closed at the controller's running event; lost gets a
	// value at each detached event (a launch that could not connect, or a
	// connection lost).
	launched chan struct{}
	lost     chan string
	done     chan struct{} // closed when Follow returned
	code     int           // Follow's exit code, once done

	mu       sync.Mutex
	lastLine string // the last line of output, for progress
	lostWhy  string // the last detached event's reason
	cancelBy string // who asked for the cancel: client, tool, exit
}

func (lr *liveRun) id() string { return lr.run.ID() }

func (lr *liveRun) isDone() bool {
	select {
	case <-lr.done:
		return true
	default:
		return false
	}
}

func (lr *liveRun) isLaunched() bool {
	select {
	case <-lr.launched:
		return true
	default:
		return false
	}
}

// cancel asks the controller for a confirmed cancel, by who (client: the
// client cancelled a request; tool: the cancel tool; exit: the client went
// away). The first asker is the one remembered.
func (lr *liveRun) cancel(who string, grace float64) {
	lr.mu.Lock()
	if lr.cancelBy == "" {
		lr.cancelBy = who
	}
	lr.mu.Unlock()
	lr.run.CancelGrace(seconds(grace))
}

func (lr *liveRun) cancelledBy() string {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.cancelBy
}

// bytes is the total delivered of both streams: progress.
func (lr *liveRun) bytes() int64 { return lr.out.size() + lr.errs.size() }

func (lr *liveRun) setLast(line string) {
	lr.mu.Lock()
	lr.lastLine = line
	lr.mu.Unlock()
}

func (lr *liveRun) last() string {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.lastLine
}

// stream is one of the job's streams as the controller delivered it: a
// file of the server's own, appended to, read back by offset. The
// controller delivers each byte once, from offset 0, so an offset here is
// the host's offset in its log.
type stream struct {
	mu   sync.Mutex
	f    *os.File
	n    int64
	line []byte // the line being written, up to maxLine bytes
	last func(string)
	// lostAt is the offset of the first byte the file could not keep (a
	// full disk), and lostErr why; -1: none lost.
	lostAt  int64
	lostErr error
}

// maxLine bounds the line kept for progress messages.
const maxLine = 200

func newStream(path string, last func(string)) (*stream, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &stream{f: f, last: last, lostAt: -1}, nil
}

// Write keeps p. The bytes are counted even when the file cannot keep
// them (a full disk), so that offsets stay the host's; read then refuses
// what lies past the first byte lost, rather than give a hole as output.
func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	if k, err := s.f.WriteAt(p, s.n); err != nil && s.lostAt < 0 {
		s.lostAt, s.lostErr = s.n+int64(k), err
	}
	s.n += int64(len(p))
	var done string
	for _, b := range p {
		if b == '\n' {
			if l := strings.TrimSpace(string(s.line)); l != "" {
				done = l
			}
			s.line = s.line[:0]
		} else if len(s.line) < maxLine {
			s.line = append(s.line, b)
		}
	}
	if done == "" {
		if l := strings.TrimSpace(string(s.line)); l != "" {
			done = l
		}
	}
	s.mu.Unlock()
	if done != "" && s.last != nil {
		s.last(validText(done))
	}
	return len(p), nil
}

func (s *stream) size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// read returns up to max bytes from offset from; bytes the file could not
// keep are an error naming the offset.
func (s *stream) read(from int64, max int) ([]byte, error) {
	s.mu.Lock()
	n, lostAt, lostErr := s.n, s.lostAt, s.lostErr
	s.mu.Unlock()
	if from >= n {
		return nil, nil
	}
	if int64(max) > n-from {
		max = int(n - from)
	}
	if lostAt >= 0 && from+int64(max) > lostAt {
		if from >= lostAt {
			return nil, fmt.Errorf("this server could not keep the output from byte %d on (%v)", lostAt, lostErr)
		}
		max = int(lostAt - from)
	}
	b := make([]byte, max)
	k, err := s.f.ReadAt(b, from)
	if err != nil && !errors.Is(err, io.EOF) {
		return b[:k], err
	}
	return b[:k], nil
}

// tail returns the last max bytes and their offset, cut to start at a
// whole UTF-8 character.
func (s *stream) tail(max int) (string, int64) {
	n := s.size()
	from := max64(0, n-int64(max))
	b, _ := s.read(from, max)
	for i := 0; i < len(b) && i < utf8.UTFMax && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
		from++
	}
	return validText(string(b)), from
}

func (s *stream) close() { s.f.Close() }

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// validText replaces what is not UTF-8, so that a JSON string carries it.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// eventHook receives the controller's events of one run (Config.Events:
// one JSON object per Write), tells the run of its launch and of lost
// connections, and passes the line on to the server's --events file.
type eventHook struct {
	lr   *liveRun
	once sync.Once
	out  io.Writer // nil: no --events
}

func (h *eventHook) Write(p []byte) (int, error) {
	var ev struct {
		Event  string `json:"event"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal(bytes.TrimSpace(p), &ev) == nil {
		switch ev.Event {
		case controller.EvRunning:
			h.once.Do(func() { close(h.lr.launched) })
		case controller.EvDetached:
			h.lr.mu.Lock()
			h.lr.lostWhy = ev.Reason
			h.lr.mu.Unlock()
			select {
			case h.lr.lost <- ev.Reason:
			default:
			}
		}
	}
	if h.out == nil {
		return len(p), nil
	}
	if ev.Event == controller.EvCancelRequested {
		// Who asked: the client's cancelled request, the cancel tool, the
		// client gone; recorded with the event.
		var m map[string]any
		if by := h.lr.cancelledBy(); by != "" && json.Unmarshal(p, &m) == nil {
			m["by"] = "mcp:" + by
			if b, err := json.Marshal(m); err == nil {
				h.out.Write(append(b, '\n'))
				return len(p), nil
			}
		}
	}
	return h.out.Write(p)
}

// lockedWriter serialises writes to one file from many runs.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// outputFiles makes the run's two output files in dir.
func outputFiles(dir, id string, last func(string)) (*stream, *stream, error) {
	out, err := newStream(filepath.Join(dir, id+".stdout"), last)
	if err != nil {
		return nil, nil, err
	}
	errs, err := newStream(filepath.Join(dir, id+".stderr"), last)
	if err != nil {
		out.close()
		return nil, nil, err
	}
	return out, errs, nil
}

// recordState names a run's state for a tool result: running while the
// server still follows it, else the ledger's state (settled, or left
// unsettled as launching or detached when the outcome could not be
// learned).
func recordState(rec ledger.Record, live bool) string {
	if live {
		return "running"
	}
	return rec.State
}

// hostLogsHint is where the output of a run this server does not hold is.
func hostLogsHint(rec *ledger.Record) string {
	return fmt.Sprintf("its output is on the host: ssh %s %s logs %s", rec.Dest, rec.RemoteBin, rec.RunID)
}

// seconds is a number of seconds as a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
