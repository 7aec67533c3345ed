package controller

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
)

// cancelLoop waits for Cancel, then for the launch, then sends
// `cancel --json --wait` over new connections until the host confirms it.
func (r *Run) cancelLoop(ctx context.Context) {
	select {
	case <-r.cancelCh:
	case <-ctx.Done():
		return
	}
	select {
	case <-r.launched:
	case <-ctx.Done():
		return
	}
	b := backoff{}
	wait := r.cfg.Grace + 30*time.Second
	words := r.cancelWords(wait) // cancelgrace.go
	for ctx.Err() == nil {
		var out, errb bytes.Buffer
		res := r.h.Call(ctx, transport.Call{Line: r.h.Remote(words...), Stdout: &out, Stderr: &errb, Timeout: wait + 30*time.Second})
		if res.Code == exitcode.OK {
			line := strings.TrimSpace(out.String())
			if f, ok := parseFinal(r.cfg.ID, line); ok {
				r.cancelFinal = &f // before the close: confirmedFinal reads it after
			}
			close(r.cancelled)
			r.ev.emit(EvCancelConfirmed, map[string]any{"record": line})
			return
		}
		if res.Code == exitcode.NoInput {
			return // no such run: nothing to cancel
		}
		if res.Code == exitcode.Usage && words[1] == "--json" && olderCancel(errb.String()) {
			// An agent-wrap older than cancel --json: its plain cancel
			// still stops the run and exits 0 only once it is confirmed
			// terminal; the final record is then learned as after any
			// cancel whose answer could not be read (wait, reconcile).
			r.cfg.Notice(fmt.Sprintf("run %s: the agent-wrap on %s has no cancel --json (it is older than this controller): cancelling with its plain cancel; 'agent-wrap deploy %s' installs this version", r.cfg.ID, r.cfg.Dest, r.cfg.Dest))
			words = append(words[:1:1], words[2:]...)
			continue
		}
		b.wait(ctx)
	}
}

// olderCancel reports whether a host's cancel refused --json as a flag it
// does not know (pflag's words).
func olderCancel(stderr string) bool {
	return strings.Contains(stderr, "unknown flag: --json")
}
