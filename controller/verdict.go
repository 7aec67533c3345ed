package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/reconcile"
)

// HostVerdict asks the host of rec, over the record's own rsh,
// destination, remote binary and root, for the run's verdict (`reconcile
// --json RUN_ID`), in one call bounded by timeout. It never writes the
// ledger and never signals: it is what a status beside the ledger's record
// shows. A host that cannot be reached, or that gives no verdict, is an
// error naming why; ssh's log files go to a directory in logDir, removed
// before it returns.
func HostVerdict(ctx context.Context, rec *ledger.Record, logDir string, timeout time.Duration) (*reconcile.Verdict, error) {
	h, err := transport.NewHost(rec.Rsh, rec.Dest, rec.RemoteBin, rec.RemoteRoot, logDir, rec.RunID)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	h.NoKeepalive() // one short call: ssh's own timeouts do
	v, res := askVerdict(ctx, h, rec.RunID, timeout)
	switch {
	case v != nil:
		return v, nil
	case res.Lost():
		return nil, fmt.Errorf("cannot reach %s: %s", rec.Dest, res.Why())
	}
	return nil, fmt.Errorf("reconcile on %s exited %d without a verdict", rec.Dest, res.Code)
}
