package controller

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/agent-wrap/agent-wrap/ledger"
)

// countingWriter counts the bytes of one of the job's streams that
// arrived (n: the offset a reattach starts from) and those written to w
// (delivered). Once a write to w fails (the reader of the controller's
// stdout went away, as with '| head'), nothing more is written, the rest
// is counted as arrived and dropped, and onClosed is called once.
type countingWriter struct {
	mu        sync.Mutex
	w         io.Writer
	n         atomic.Int64
	delivered atomic.Int64
	closed    atomic.Bool
	onWrite   func()          // called after each write, outside the lock
	onClosed  func(err error) // called once, when a write to w fails, outside the lock
}

// outputClosed answers a reader that went away (a write to the
// controller's stdout or stderr failed): as ssh's SIGPIPE ends `ssh HOST
// CMD | head`, the run is cancelled, and the ledger and the events say
// what was delivered and that the reader went away.
func (r *Run) outputClosed(stream string, w *countingWriter, err error) {
	r.update(func(*ledger.Record) {}) // enqueue writes the closed flags and the counts
	r.ev.emit(EvOutputClosed, map[string]any{"stream": stream, "delivered": w.delivered.Load(), "error": err.Error()})
	r.cfg.Notice(fmt.Sprintf("run %s: the reader of its %s went away after %d bytes (%v); cancelling the run, as ssh's SIGPIPE would end it", r.cfg.ID, stream, w.delivered.Load(), err))
	r.Cancel()
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	var failed error
	if !c.closed.Load() {
		k, err := c.w.Write(p)
		c.delivered.Add(int64(k))
		if err != nil {
			c.closed.Store(true)
			failed = err
		}
	}
	c.n.Add(int64(len(p)))
	c.mu.Unlock()
	if failed != nil && c.onClosed != nil {
		c.onClosed(failed)
	}
	if c.onWrite != nil && len(p) > 0 {
		c.onWrite()
	}
	return len(p), nil
}
