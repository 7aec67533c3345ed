package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/timeline"
)

// ErrHostNoRun is HostShow's error when the host has no run of the ID
// (it was never started there, or gc removed it): the host's 66.
var ErrHostNoRun = errors.New("the host has no run of this ID (never started, or removed by gc)")

// HostShow asks the host of rec, over the record's own rsh, destination,
// remote binary and root, for the run's timeline (`show --json RUN_ID`),
// in one call bounded by timeout. It returns the host's timeline and the
// remote exit code (0, or 1 when the host's journal is broken or a file of
// the run unreadable). It never writes the ledger and never signals. A
// host that cannot be reached is an error and code 255; a host without
// the run is ErrHostNoRun and 66; ssh's log files go to a directory in
// logDir, removed before it returns.
func HostShow(ctx context.Context, rec *ledger.Record, logDir string, timeout time.Duration) (*timeline.Show, int, error) {
	h, err := transport.NewHost(rec.Rsh, rec.Dest, rec.RemoteBin, rec.RemoteRoot, logDir, rec.RunID)
	if err != nil {
		return nil, 255, err
	}
	defer h.Close()
	h.NoKeepalive() // one short call: ssh's own timeouts do
	var out, errb bytes.Buffer
	res := h.Call(ctx, transport.Call{Line: h.Remote("show", "--json", rec.RunID), Stdout: &out, Stderr: &errb, Timeout: timeout})
	if res.Lost() {
		return nil, 255, fmt.Errorf("cannot reach %s: %s", rec.Dest, res.Why())
	}
	var s timeline.Show
	if err := json.Unmarshal(out.Bytes(), &s); err == nil && s.RunID == rec.RunID {
		return &s, res.Code, nil
	}
	last := lastLine(strings.TrimSpace(errb.String()))
	switch {
	case res.Code == 66:
		return nil, 66, ErrHostNoRun
	case res.Code == 127 || res.Code == 126:
		return nil, res.Code, fmt.Errorf("%s has no agent-wrap at %q (exit %d)", rec.Dest, rec.RemoteBin, res.Code)
	case res.Code == 64 && strings.Contains(last, "show"):
		return nil, res.Code, fmt.Errorf("the agent-wrap on %s has no show command (an older version): %s", rec.Dest, last)
	}
	return nil, res.Code, fmt.Errorf("show on %s exited %d without a timeline: %s", rec.Dest, res.Code, last)
}
