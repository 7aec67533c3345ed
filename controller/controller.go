package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Config is one run to start. Zero values take the defaults named.
type Config struct {
	Rsh        []string // the ssh command's words; default ["ssh"]
	Dest       string   // the ssh destination; required
	RemoteBin  string   // the remote agent-wrap; default "agent-wrap"
	RemoteRoot string   // the remote --root; default: the host's own default
	ID         string   // the run ID; default: NewID's 128 random bits

	Lease      time.Duration // default 5m; negative: no lease (run --lease 0)
	Grace      time.Duration // default 5s
	RenewEvery time.Duration // default a third of the lease
	// GiveUp is how long after the last renewal that succeeded (or the
	// launch, before any) Follow stops trying to learn the outcome (see
	// gaveUp). Default: lease + grace + 30s; with no lease, 5 minutes after
	// the connection was lost.
	GiveUp time.Duration

	// Mux is MuxAuto ("" too: the calls are sessions on agent-wrap's own
	// ControlMasters, unless the rsh is not OpenSSH's or the user set a
	// ControlPath) or MuxOff (a connection per call). MuxDir is where the
	// masters' sockets live; default MuxDir(os.Getenv). See transport/mux.go.
	Mux, MuxDir string

	Ledger ledger.Store // required: files or PostgreSQL, the same to the controller
	// LogDir is where the run's ssh -E logs go (a directory per run,
	// removed by Follow, or by Settle after a controller was killed).
	// Default: os.TempDir().
	LogDir string
	Events io.Writer // controller events as JSON lines; nil: none
	Stdout io.Writer // the job's stdout; required
	Stderr io.Writer // the job's stderr; required
	// Control is the outer wrapper's control socket when the controller
	// runs inside a run (the job's AGENT_WRAP_CONTROL), and OuterRunID that
	// run's ID (AGENT_WRAP_RUN_ID): the run is then a handoff of the outer
	// run, bounded by it (nested.go). "": not inside a run.
	Control    string
	OuterRunID string
	// HTTP are the run's credential gateways, loaded (httpgw.Load: their
	// secrets and CA files read here); the launch sends them to the host
	// over its stdin (http.go). nil: none.
	HTTP []*httpgw.Spec
	// Agent is the host's run --agent (AgentScoped, AgentInherit,
	// AgentNone), with the launch connection forwarding the controller's
	// agent or not (agent.go); "": neither passed nor set.
	Agent string
	// AgentSocket is the controller's own agent (its SSH_AUTH_SOCK), the
	// one the launch connection forwards; "": ssh's own choice.
	AgentSocket string
	// Stdin is the job's stdin, byte for byte, end of file included,
	// across reattaches (stdin.go): an io.Reader the controller reads
	// once, as it is sent (os.Stdin, or bytes.NewReader for bytes a caller
	// holds). nil: the job's stdin is /dev/null, as `ssh -n`.
	Stdin io.Reader
	// StdinKeep bounds the bytes of Stdin kept after they were sent, to
	// send again after a lost connection; 0: DefaultStdinKeep (see
	// StdinKeepFromEnv).
	StdinKeep int64
	// Notice receives the controller's own words (a detach, a cancel, an
	// unknown outcome), without prefix or newline. nil: Stderr, prefixed
	// "agent-wrap: ".
	Notice func(string)
}

// exitCancelledBeforeLaunch is Follow's code for a run cancelled before
// the host ever claimed it (ledger: not_started): 143, as a cancelled run,
// whichever of INT, TERM or HUP asked (a cancel after the launch is the
// remote `cancel`, also 143).
const exitCancelledBeforeLaunch = exitcode.TERM

// Run is a run started by Start. Its methods are safe for concurrent use.
//
// Its goroutines are Follow's loop (launch, attach, finish), the renew
// and cancel loops (renew.go, cancel.go), the give-up timers (giveup.go)
// and the output writers' callbacks (output.go). What they share is in
// four groups below, each with one way of being shared.
type Run struct {
	// Set before Follow's goroutines start, then only read (each pointer
	// guards what it holds itself: the writer, the counters, the stdin
	// stream have locks of their own).
	cfg       Config
	argv      []string
	h         *transport.Host // the transport: every remote call is h.Call
	ev        *eventLog
	w         *writer         // writes rec's states to the ledger, in order
	out, errw *countingWriter // the job's stdout and stderr, counted
	nest      *nested         // the outer run, inside a run (nested.go); set by follow
	gw        *httpLaunch     // the gateways the launch sends (http.go)
	in        *stdinStream    // the job's stdin (stdin.go); nil: /dev/null

	// mu guards the run's state and its ledger record, which change
	// together (move, update): st moves by state.go's transitions only,
	// and rec is the record as last queued for writing. The write is
	// waited for outside mu.
	mu  sync.Mutex
	st  runState
	rec ledger.Record

	// Milestones: channels closed once each, waited on with select and
	// asked with isClosed. launched and cancelCh are closed only once
	// st's onLaunched and onCancel are written and announced, so what
	// acts on them (the renewals, the remote cancel, isLaunched,
	// cancelRequested) never acts before the ledger says so.
	launched  chan struct{}
	cancelCh  chan struct{}
	cancelled chan struct{} // the host confirmed the cancel (cancelLoop)
	// cancelFinal is the final record the cancel's confirmation named, or
	// nil: written before cancelled is closed, read only after (confirmedFinal).
	cancelFinal *finalWord
	renewNow    chan struct{} // buffered 1: a renewal wanted before the next tick (a reattach asks)

	// Facts each written and read on their own by several goroutines: no
	// two need to change together, so each is an atomic, not under mu.
	lastRenew   atomic.Int64 // unix nanoseconds of the last successful renewal (or progress that counts as one: gaveUp)
	renewFailed atomic.Bool  // a renewal was refused: the run is ending
	reattaching atomic.Value // string "N,M": a reattach from these offsets is not yet known to be up
	lostSaid    atomic.Bool  // the current loss was said; cleared when attached
	// mayHaveSent: some launch attempt may have sent its command to the
	// host (mayHaveSent, launchfail.go). While false, no attempt got past
	// the login, so a give-up before the launch knows the run was never
	// started.
	mayHaveSent atomic.Bool
	noAttach    atomic.Bool // the host's agent-wrap has no attach: follow with wait
	// cancelGrace is the remote cancel's --grace in nanoseconds; 0: the
	// host's default (cancelgrace.go).
	cancelGrace atomic.Int64
}

// ID returns the run ID.
func (r *Run) ID() string { return r.cfg.ID }

// Record returns a copy of the run's ledger record as last written.
func (r *Run) Record() ledger.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}

// Start checks cfg, writes the run's ledger record (launching) durably and
// returns. It makes no connection. See the package doc.
func Start(cfg Config, argv []string) (*Run, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run")
	}
	if cfg.Dest == "" {
		return nil, errors.New("no destination")
	}
	if cfg.Ledger == nil || cfg.Stdout == nil || cfg.Stderr == nil {
		return nil, errors.New("controller: Config needs Ledger, Stdout and Stderr")
	}
	if len(cfg.Rsh) == 0 {
		cfg.Rsh = []string{"ssh"}
	}
	if cfg.RemoteBin == "" {
		cfg.RemoteBin = "agent-wrap"
	}
	if cfg.ID == "" {
		cfg.ID = ledger.NewID()
	}
	if err := rundir.ValidID(cfg.ID); err != nil {
		return nil, err
	}
	gw, gateways, err := newHTTPLaunch(cfg.HTTP)
	if err != nil {
		return nil, err
	}
	if cfg.Lease == 0 {
		cfg.Lease = 5 * time.Minute
	}
	if cfg.Grace == 0 {
		cfg.Grace = 5 * time.Second
	}
	if cfg.RenewEvery <= 0 && cfg.Lease > 0 {
		cfg.RenewEvery = cfg.Lease / 3
	}
	if cfg.GiveUp <= 0 {
		if cfg.Lease > 0 {
			cfg.GiveUp = cfg.Lease + cfg.Grace + 30*time.Second
		} else {
			cfg.GiveUp = 5 * time.Minute
		}
	}
	if cfg.Notice == nil {
		w := cfg.Stderr
		cfg.Notice = func(s string) { fmt.Fprintf(w, "agent-wrap: %s\n", s) }
	}
	if cfg.LogDir == "" {
		cfg.LogDir = os.TempDir()
	}
	h, err := transport.NewHost(cfg.Rsh, cfg.Dest, cfg.RemoteBin, cfg.RemoteRoot, cfg.LogDir, cfg.ID)
	if err != nil {
		return nil, err
	}
	if err := h.SetMux(cfg.Mux, cfg.MuxDir); err != nil {
		h.Close()
		return nil, err
	}
	r := &Run{
		cfg: cfg, argv: argv, h: h, gw: gw,
		ev:        &eventLog{w: cfg.Events, id: cfg.ID},
		out:       &countingWriter{w: cfg.Stdout},
		errw:      &countingWriter{w: cfg.Stderr},
		launched:  make(chan struct{}),
		cancelCh:  make(chan struct{}),
		cancelled: make(chan struct{}),
		renewNow:  make(chan struct{}, 1),
	}
	lease := cfg.Lease.Seconds()
	if cfg.Lease < 0 {
		lease = 0
	}
	now := time.Now().UTC()
	r.rec = ledger.Record{
		RunID: cfg.ID, Dest: cfg.Dest, State: ledger.Launching,
		Rsh: cfg.Rsh, RemoteBin: cfg.RemoteBin, RemoteRoot: cfg.RemoteRoot,
		Command: argv, HTTP: gateways, Lease: lease, Grace: cfg.Grace.Seconds(),
		CreatedAt: now, ControllerPID: os.Getpid(),
		Controller: Self(), GiveUp: cfg.GiveUp.Seconds(),
	}
	r.rec.ControllerStart = Self().Start
	if err := createLaunching(&r.cfg, &r.rec); err != nil {
		h.Close()
		return nil, err
	}
	r.w = newWriter(cfg.Ledger, cfg.ID, cfg.GiveUp, cfg.Notice)
	r.out.onWrite, r.errw.onWrite = r.progress, r.progress
	r.out.onClosed = func(err error) { r.outputClosed("stdout", r.out, err) }
	r.errw.onClosed = func(err error) { r.outputClosed("stderr", r.errw, err) }
	if cfg.Stdin != nil {
		r.in = newStdinStream(cfg.Stdin, cfg.StdinKeep)
	}
	r.reattaching.Store("")
	r.lastRenew.Store(time.Now().UnixNano())
	r.ev.emit(EvLaunching, map[string]any{"dest": cfg.Dest, "command": argv, "lease_seconds": lease})
	return r, nil
}

// Follow drives the run to its end; see the package doc. It returns the
// exit code for the controller: the run's, or 255 when unknown, when the
// ledger stayed away past --give-up, or when someone else settled the run
// meanwhile (ledger.ErrLost: this controller does not overwrite it).
func (r *Run) Follow(ctx context.Context) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.startHeartbeat()
	defer r.stopHeartbeat()
	go func() {
		select {
		case <-r.w.fatal:
			cancel()
		case <-ctx.Done():
		}
	}()
	code := r.follow(ctx)
	if err := r.w.finish(); err != nil {
		r.cfg.Notice(err.Error())
		return exitcode.Lost
	}
	return code
}

// update changes the ledger record under the lock and writes it durably,
// waiting for the write while the ledger answers. While it does not, the
// write is queued and retried in order (see writer) and the run goes on.
// The record's state is move's to change.
func (r *Run) update(change func(*ledger.Record)) {
	r.mu.Lock()
	change(&r.rec)
	n := r.enqueue()
	r.mu.Unlock()
	r.w.wait(n)
}

// move applies e to the run's state (runState.next). When the state
// allows it, an event the ledger records (runEvent.recorded) writes the
// record with the new state's ledger name and change applied (change sees
// the state moved from), durably, as update does. It returns the state
// moved from and whether e was allowed; a refused e changes nothing.
func (r *Run) move(e runEvent, change func(l *ledger.Record, from runState)) (runState, bool) {
	r.mu.Lock()
	from := r.st
	to, err := from.next(e)
	if err != nil {
		r.mu.Unlock()
		return from, false
	}
	r.st = to
	if !e.recorded() {
		r.mu.Unlock()
		return from, true
	}
	r.rec.State = to.ledgerState()
	if change != nil {
		change(&r.rec, from)
	}
	n := r.enqueue()
	r.mu.Unlock()
	r.w.wait(n)
	return from, true
}

// enqueue queues the record, with its byte counts, for writing. Called
// with mu held.
func (r *Run) enqueue() uint64 {
	r.rec.StdoutBytes, r.rec.StderrBytes = r.out.delivered.Load(), r.errw.delivered.Load()
	r.rec.StdoutClosed, r.rec.StderrClosed = r.out.closed.Load(), r.errw.closed.Load()
	return r.w.enqueue(r.rec)
}

// now returns the run's state.
func (r *Run) now() runState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

// Cancel asks for the run to be cancelled: the ledger says cancel_requested
// (synced) when it returns, and Follow sends `cancel --wait` over a new
// connection. Calling it again, or after the run is settled, does nothing.
func (r *Run) Cancel() {
	if _, ok := r.move(onCancel, func(l *ledger.Record, _ runState) { l.CancelRequested = true }); !ok {
		if r.now().cancel {
			<-r.cancelCh // a Cancel at the same time: its record is written when it returns
		}
		return
	}
	r.ev.emit(EvCancelRequested, nil)
	r.cfg.Notice(fmt.Sprintf("run %s: cancelling on %s", r.cfg.ID, r.cfg.Dest))
	close(r.cancelCh)
}

func (r *Run) cancelRequested() bool { return isClosed(r.cancelCh) }

// confirmedFinal returns the final record the host's cancel confirmation
// named, once the confirmation came; nil before, or when it named none.
func (r *Run) confirmedFinal() *finalWord {
	if !isClosed(r.cancelled) {
		return nil
	}
	return r.cancelFinal
}

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// follow is Follow's loop (owner.go has Follow).
func (r *Run) follow(ctx context.Context) int {
	defer r.h.Close()
	if code, refused := r.registerNested(); refused {
		return code
	}
	defer r.endNested() // last: the outcome is settled by then
	ctx, stop := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait() // after stop: the renewals and the cancel end with ctx
	defer stop()
	bg.Add(2)
	go func() { defer bg.Done(); r.renewLoop(ctx) }()
	go func() { defer bg.Done(); r.cancelLoop(ctx) }()

	b := backoff{}
	probe := false // a launch was lost before its answer: is the run there?
	for {
		if r.gaveUp() {
			return r.giveUp()
		}
		if ctx.Err() != nil {
			return r.unknown("stopped before the outcome was known")
		}
		if !r.isLaunched() {
			if code, done := r.launchStep(ctx, &b, &probe); done {
				return code
			}
			continue
		}
		start := time.Now()
		delivered := r.out.n.Load() + r.errw.n.Load()
		res := r.attach(ctx)
		if r.out.n.Load()+r.errw.n.Load() > delivered || time.Since(start) > backoffMax {
			b.reset()
		}
		if res.Lost() {
			r.detached(res.Why())
			b.wait(ctx)
			continue
		}
		if code, done := r.finish(ctx, res.Code); done {
			return code
		}
		b.wait(ctx)
	}
}

func (r *Run) isLaunched() bool { return isClosed(r.launched) }

// finish settles the run after its attach ended with code. done is false
// when the run turns out to be live (attach ended early): follow it again.
// What the code means is judge's to say (outcome.go); finish waits for
// the cancel's confirmation and asks the host as judge needs.
func (r *Run) finish(ctx context.Context, code int) (int, bool) {
	r.move(onEnded, nil)
	f := facts{at: atEnd, code: code, cancel: r.cancelRequested(), dest: r.cfg.Dest, bin: r.cfg.RemoteBin}
	if f.cancel {
		// The cancel's confirmation names the final state and cause; it
		// comes with the attach's end. Without it, ask reconcile.
		select {
		case <-r.cancelled:
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
		f.final = r.confirmedFinal()
	}
	b := backoff{}
	for {
		j := judge(f)
		if j.noAttach {
			r.attachRefused()
		}
		switch j.next {
		case doRetry:
			if r.gaveUp() || ctx.Err() != nil {
				return r.giveUp(), true
			}
			b.wait(ctx)
			fallthrough
		case doAsk:
			// Ask the host what the code means: the record's state and cause.
			f.v, f.res = r.reconcile(ctx)
			f.asked = true
			continue
		case doFollow:
			r.move(onLive, nil)
			return 0, false
		}
		return r.conclude(j), true
	}
}

// conclude records a judgment that ends Follow (doSettle, doLeave), says
// what it must, and returns Follow's exit code.
func (r *Run) conclude(j judgment) int {
	if j.next == doLeave {
		if j.record {
			r.update(func(l *ledger.Record) { l.Reason = j.reason })
		}
		return r.unknown(j.reason)
	}
	r.settle(j.outcome, j.code, j.cause, j.reason)
	switch {
	case j.outcome == ledger.Unknown:
		return r.unknown(j.reason)
	case j.notStarted:
		r.cfg.Notice(fmt.Sprintf("run %s: not started: %s", r.cfg.ID, j.reason))
		if j.hint != "" {
			r.cfg.Notice("hint: " + j.hint)
		}
	}
	return j.exit
}

// reconcile asks the host for the run's verdict (nil when none came).
func (r *Run) reconcile(ctx context.Context) (*reconcile.Verdict, transport.Result) {
	return askVerdict(ctx, r.h, r.cfg.ID, r.cfg.Grace+30*time.Second)
}

func askVerdict(ctx context.Context, h *transport.Host, id string, timeout time.Duration) (*reconcile.Verdict, transport.Result) {
	var out, errb bytes.Buffer
	res := h.Call(ctx, transport.Call{Line: h.Remote("reconcile", "--json", id), Stdout: &out, Stderr: &errb, Timeout: timeout})
	if res.Lost() {
		return nil, res
	}
	var v reconcile.Verdict
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &v); err != nil || v.RunID != id {
		return nil, res
	}
	return &v, res
}

// settle records the outcome: state settled.
func (r *Run) settle(outcome string, code int, cause, reason string) {
	if _, ok := r.move(onSettle, func(l *ledger.Record, _ runState) { l.MarkSettled(outcome, code, cause, reason) }); !ok {
		return
	}
	f := map[string]any{"outcome": outcome, "cause": cause}
	if code >= 0 {
		f["exit_code"] = code
	}
	if reason != "" {
		f["reason"] = reason
	}
	r.ev.emit(EvSettled, f)
}

// launchFailed answers a launch that ended without a record: the host's
// agent-wrap refused or failed (its message was relayed), or the host has
// no agent-wrap. A verdict decides which (judge, outcome.go).
func (r *Run) launchFailed(ctx context.Context, code int, said string) int {
	r.move(onEnded, nil)
	v, res := r.reconcile(ctx)
	return r.conclude(judge(facts{at: atLaunch, code: code, asked: true, v: v, res: res, dest: r.cfg.Dest, bin: r.cfg.RemoteBin, said: said}))
}

// unknown says the outcome is unknown, naming settle, and returns 255.
func (r *Run) unknown(reason string) int {
	r.cfg.Notice(fmt.Sprintf("run %s on %s: outcome unknown: %s", r.cfg.ID, r.cfg.Dest, reason))
	r.cfg.Notice(fmt.Sprintf("hint: 'agent-wrap settle %s' asks the host again and records the outcome", r.cfg.ID))
	return exitcode.Lost
}
