package controller

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Event names written to Config.Events, one JSON object per line, each
// with "event", "run_id" and "at" (RFC 3339, UTC, nanoseconds).
const (
	EvLaunching       = "launching"
	EvRunning         = "running"
	EvRenewed         = "renewed"
	EvRenewFailed     = "renew_failed"
	EvDetached        = "detached"
	EvAttached        = "attached"
	EvCancelRequested = "cancel_requested"
	EvCancelConfirmed = "cancel_confirmed"
	EvSettled         = "settled"
	// EvOutputClosed: the reader of the controller's stdout or stderr
	// went away (stream, delivered bytes, error); the run is cancelled.
	EvOutputClosed = "output_closed"
)

type eventLog struct {
	mu sync.Mutex
	w  io.Writer
	id string
}

// emit writes one event line; a write error is ignored (events are for a
// UI; the ledger is the record).
func (l *eventLog) emit(event string, fields map[string]any) {
	if l == nil || l.w == nil {
		return
	}
	m := map[string]any{"event": event, "run_id": l.id, "at": time.Now().UTC().Format(time.RFC3339Nano)}
	for k, v := range fields {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(b, '\n'))
}
