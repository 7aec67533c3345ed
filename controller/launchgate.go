package controller

import (
	"context"
	"io"
	"os"
	"sync"
)

// The launch gate (with agent-wrap's masters, transport/mux.go). A session's client
// hands its request to the master and can be killed (a cancel, --give-up)
// while the master still waits for the host to open the session; the
// master then runs the command anyway, after the controller has judged the
// launch, possibly seconds later: a run the ledger calls not_started could
// start behind a settle's back. So, through a master, the launch line
// first says it is ready and waits for a word from the controller on its
// stdin, a pipe only the controller writes:
//
//	echo agent-wrap-launch-ready && read -r go && [ "$go" = go ] && LAUNCH
//
// The controller answers "go" (and then the gateways' secrets, if any, and
// end of file) when the ready line arrives and the launch is still wanted
// (its context not ended). Without a "go" it closes the pipe when the call
// ends, so a session that opens after its client was killed reads end of
// file, and runs nothing. A launch killed after the "go" is one that may
// have sent its command (mayHaveSent), as any.

// gateReady is the launch's ready line (without its newline).
const gateReady = "agent-wrap-launch-ready"

type launchGate struct {
	ctx  context.Context
	r, w *os.File // the remote command's stdin: r to the client, w the controller's
	// payload follows "go" (the gateways' secrets, http.go); then the
	// pipe is closed: the remote command reads end of file after it.
	payload []byte
	// then, when set, takes the pipe after the payload (the job's stdin,
	// stdin.go) and closes it; else the pipe is closed after the payload.
	then func(w io.WriteCloser)
	mu   sync.Mutex
	open bool // "go" was written
}

func newLaunchGate(ctx context.Context) (*launchGate, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &launchGate{ctx: ctx, r: r, w: w}, nil
}

// wrap returns the launch line behind the gate.
func (g *launchGate) wrap(line string) string {
	return "echo " + gateReady + ` && read -r go && [ "$go" = go ] && ` + line
}

// ready answers the ready line: "go", unless the launch is no longer
// wanted (then the pipe is closed: the session reads end of file).
func (g *launchGate) ready() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open || g.w == nil {
		return
	}
	if g.ctx.Err() != nil {
		g.w.Close()
		g.w = nil
		return
	}
	// Written in the background: a payload larger than the pipe's
	// buffer must not hold the reading of the launch's stdout.
	g.open = true
	w := g.w
	g.w = nil
	then := g.then
	go func() {
		if _, err := w.Write(append([]byte("go\n"), g.payload...)); err != nil || then == nil {
			w.Close()
			return
		}
		then(w)
	}()
}

// close ends the gate once the call is over: whatever session may still
// open reads end of file.
func (g *launchGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w != nil {
		g.w.Close()
		g.w = nil
	}
	g.r.Close()
}
