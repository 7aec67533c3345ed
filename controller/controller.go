package controller

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// masters' sockets live; default MuxDir(os.Getenv). See mux.go.
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

// Backoff bounds between reattach attempts after the first, which is at
// once: 0.2 s doubling to 5 s.
const (
	backoffMin = 200 * time.Millisecond
	backoffMax = 5 * time.Second
)

// Run is a run started by Start. Its methods are safe for concurrent use.
type Run struct {
	cfg  Config
	argv []string
	h    *host
	ev   *eventLog

	mu  sync.Mutex
	st  runState      // the run's state (state.go), moved with rec by move
	rec ledger.Record // the ledger record as last written
	w   *writer       // writes rec's states to the ledger, in order

	out, errw *countingWriter

	lastRenew atomic.Int64 // unix nanoseconds of the last successful renewal
	// launched and cancelCh are closed once st's onLaunched and onCancel
	// are written and announced: what acts on them (the renewals, the
	// remote cancel, isLaunched, cancelRequested) never acts before the
	// ledger says so.
	launched    chan struct{}
	cancelCh    chan struct{}
	cancelled   chan struct{} // closed once the host confirmed the cancel
	renewFailed atomic.Bool   // a renewal was refused: the run is ending
	reattaching atomic.Value  // string "N,M": a reattach from these offsets is not yet known to be up
	renewNow    chan struct{} // a renewal wanted before the next tick
	cancelFinal atomic.Pointer[finalWord]
	lostSaid    atomic.Bool // the current loss was said; cleared when attached
	// mayHaveSent: some launch attempt may have sent its command to the
	// host (host.mayHaveSent). While false, no attempt got past the login,
	// so a give-up before the launch knows the run was never started.
	mayHaveSent atomic.Bool
	noAttach    atomic.Bool  // the host's agent-wrap has no attach: follow with wait
	nest        *nested      // the outer run, inside a run (nested.go); set before Follow's goroutines
	gw          *httpLaunch  // the gateways the launch sends (http.go)
	in          *stdinStream // the job's stdin (stdin.go); nil: /dev/null

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
	h, err := newHost(cfg.Rsh, cfg.Dest, cfg.RemoteBin, cfg.RemoteRoot, cfg.LogDir, cfg.ID)
	if err != nil {
		return nil, err
	}
	if err := h.setMux(cfg.Mux, cfg.MuxDir); err != nil {
		h.close()
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
		h.close()
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

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// gaveUp reports whether --give-up has passed since the last renewal that
// succeeded. Where there is nothing to renew (no lease, or the host refused
// a renewal because the run is ending) the output's progress and each
// successful connection count as renewals, and a run without a lease gives
// up only while detached.
func (r *Run) gaveUp() bool {
	if r.cfg.Lease < 0 {
		if p := r.now().phase; p != phaseDetached && p != phaseLaunching {
			return false
		}
	}
	return time.Since(time.Unix(0, r.lastRenew.Load())) > r.cfg.GiveUp
}

// progress is called on every write of the job's output.
func (r *Run) progress() {
	r.attached()
	if r.cfg.Lease < 0 || r.renewFailed.Load() {
		r.lastRenew.Store(time.Now().UnixNano())
	}
}

// follow is Follow's loop (owner.go has Follow).
func (r *Run) follow(ctx context.Context) int {
	defer r.h.close()
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
		if res.lost() {
			r.detached(res.why())
			b.wait(ctx)
			continue
		}
		if code, done := r.finish(ctx, res.code); done {
			return code
		}
		b.wait(ctx)
	}
}

func (r *Run) isLaunched() bool { return isClosed(r.launched) }

// launch runs `run --detach ... 2>&1 && exec attach` on one connection.
// The detach's words (its record last) come first on stdout; what comes
// after the record is the job's. It returns the record when one arrived,
// and what came before it (messages) as said.
func (r *Run) launch(ctx context.Context) (callResult, *launchRecord, string) {
	lease := "0"
	if r.cfg.Lease > 0 {
		lease = r.cfg.Lease.String()
	}
	if l := r.nestedLaunchLease(); l != "" {
		lease = l
	}
	words := append(append([]string{"run", "--detach", "--lease", lease, "--grace", r.cfg.Grace.String()}, r.agentFlags()...), r.gw.args...)
	words = append(words, r.stdinWords()...)
	words = append(append(words, r.cfg.ID, "--"), r.argv...)
	// --from before the ID: an agent-wrap too old to know attach reads
	// this as the short form of run with an unknown flag, a usage error
	// (64) found before any claim, rather than run a job named RUN_ID.
	snd, stdinFrom := r.stdinSender() // stdin.go: the job's stdin follows the gateways' secrets
	if snd != nil {
		defer snd.stop()
	}
	attachWords := append(append([]string{"attach", "--from", "0,0"}, stdinFrom...), r.cfg.ID)
	line := r.h.remote(words...) + " 2>&1 && exec " + r.h.remote(attachWords...)

	ctx, cancel := r.withGiveUp(ctx)
	defer cancel()
	lh := r.launchHost()
	stdin, forget := r.gw.stdin() // the gateways' secrets, sent again on each try
	defer forget()
	var gate *launchGate // launchgate.go
	if lh.mux != nil {
		g, err := newLaunchGate(ctx)
		if err != nil {
			return callResult{code: exitcode.Lost, err: err, noLog: true}, nil, ""
		}
		gate, line = g, g.wrap(line)
		// Through a master: the gate's pipe carries "go", then the
		// secrets, then the job's stdin. Set before the ready line can
		// be read.
		gate.payload = stdin
		if snd != nil {
			gate.then = snd.run
		}
	}
	pr, pw := io.Pipe()
	var rec *launchRecord
	var said bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		rec = r.splitLaunch(pr, &said, gate)
		io.Copy(io.Discard, pr)
	}()
	errw := r.newLaunchStderr()
	var res callResult
	switch {
	case gate != nil:
		res = lh.callIn(longSession(ctx), line, gate.r, pw, errw)
		if snd != nil {
			snd.stop()
		}
		gate.close()
	case snd != nil:
		in, done, err := snd.pipe(stdin)
		if err != nil {
			res = callResult{code: exitcode.Lost, err: err}
			break
		}
		res = lh.callIn(ctx, line, in, pw, errw)
		snd.stop()
		done()
	default:
		res = lh.call(withStdin(ctx, stdin), line, pw, errw)
	}
	pw.Close()
	<-done
	res.early = errw.end()
	if said.Len() > 0 {
		// What the host said before (or instead of) a record: agent-wrap's
		// messages, or the shell's (command not found). Not the job's, so
		// not counted in its stderr.
		r.cfg.Stderr.Write(said.Bytes())
	}
	return res, rec, said.String()
}

// launchRecord is what the controller reads of the run --detach record.
type launchRecord struct {
	RunID  string `json:"run_id"`
	State  string `json:"state"`
	PID    int    `json:"pid"`
	PGID   int    `json:"pgid"`
	BootID string `json:"boot_id"`
}

// splitLaunch reads the launch connection's stdout: lines before the
// record's opening "{" line go to said, the record is decoded, and
// everything after it is copied to the job's stdout (counted). It returns
// nil when no record came.
func (r *Run) splitLaunch(in io.Reader, said *bytes.Buffer, gate *launchGate) *launchRecord {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if gate != nil && line == gateReady+"\n" {
			gate.ready()
			continue
		}
		if line == "{\n" {
			var rec launchRecord
			dec := json.NewDecoder(io.MultiReader(strings.NewReader(line), br))
			if err := dec.Decode(&rec); err != nil || rec.RunID != r.cfg.ID {
				said.WriteString(line)
				return nil
			}
			rest := io.MultiReader(dec.Buffered(), br)
			var nl [1]byte
			if n, _ := io.ReadFull(rest, nl[:]); n == 1 && nl[0] != '\n' {
				r.out.Write(nl[:])
			}
			r.running(&rec)
			io.Copy(r.out, rest)
			return &rec
		}
		said.WriteString(line)
		if err != nil {
			return nil
		}
	}
}

// running records the run's start on the host (its record, or a verdict
// that the host has it), then wakes what waits for the launch. Once: a
// second start is refused by the run's state.
func (r *Run) running(rec *launchRecord) {
	if _, ok := r.move(onLaunched, func(l *ledger.Record, _ runState) {
		l.RemotePID, l.RemotePGID, l.BootID = rec.PID, rec.PGID, rec.BootID
		l.Reason = ""
	}); !ok {
		return
	}
	r.lostSaid.Store(false)
	r.ev.emit(EvRunning, map[string]any{"remote_pid": rec.PID, "boot_id": rec.BootID})
	close(r.launched)
	r.gw.forget()
}

// attach runs `attach --from N,M` from the byte counts delivered so far.
func (r *Run) attach(ctx context.Context) callResult {
	from := fmt.Sprintf("%d,%d", r.out.n.Load(), r.errw.n.Load())
	if r.now().phase == phaseDetached {
		r.reattaching.Store(from)
		// Renew at once: the lease may have lost renewals while detached,
		// and a renewal that succeeds confirms the host is back.
		select {
		case r.renewNow <- struct{}{}:
		default:
		}
	}
	ctx, cancel := r.withGiveUp(ctx)
	defer cancel()
	var res callResult
	snd, stdinFrom := (*stdinSender)(nil), []string(nil)
	if !r.noAttach.Load() {
		snd, stdinFrom = r.stdinSender() // stdin.go: the job's stdin, sent again from the oldest byte kept
	}
	line := r.h.remote(append(append([]string{"attach", "--from", from}, stdinFrom...), r.cfg.ID)...)
	if r.noAttach.Load() {
		// The host cannot stream: learn the end with wait (75 at the
		// timeout, which finish takes for a live run and follows again).
		line = r.h.remote("wait", "--timeout", "60s", r.cfg.ID)
	}
	if snd != nil {
		in, done, err := snd.pipe(nil)
		if err != nil {
			return callResult{code: exitcode.Lost, err: err}
		}
		res = r.h.callIn(longSession(ctx), line, in, r.out, r.errw) // muxticket.go
		snd.stop()
		done()
	} else {
		res = r.h.call(longSession(ctx), line, r.out, r.errw) // muxticket.go
	}
	if !res.lost() {
		r.attached()
		if r.cfg.Lease < 0 || r.renewFailed.Load() {
			r.lastRenew.Store(time.Now().UnixNano())
		}
	}
	r.reattaching.Store("")
	return res
}

// attached records that a reattach is up: its first byte arrived, a
// renewal succeeded while it ran, or it ended with the run's code. The
// ledger is running again and the event is attached, once per reattach.
func (r *Run) attached() {
	from, _ := r.reattaching.Swap("").(string)
	if from == "" {
		return
	}
	r.lostSaid.Store(false)
	if _, ok := r.move(onAttached, func(l *ledger.Record, was runState) {
		if was.phase == phaseDetached {
			l.Reason = ""
		}
	}); !ok {
		return
	}
	r.ev.emit(EvAttached, map[string]any{"from": from})
}

// withGiveUp returns ctx that also ends when --give-up passes, whatever
// the call's ssh still believes. It sleeps until the give-up would pass if
// nothing were renewed meanwhile, then looks: a renewal since moved the
// time on, so a run in flight wakes it about once per --give-up, not
// several times a second. Past that time without having given up (a run
// without a lease gives up only while detached or launching), it looks
// every giveUpLook.
func (r *Run) withGiveUp(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTimer(r.untilGiveUp())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if r.gaveUp() {
					cancel()
					return
				}
				t.Reset(r.untilGiveUp())
			}
		}
	}()
	return ctx, cancel
}

// giveUpLook is how often withGiveUp looks once the give-up time has passed
// without the run giving up.
const giveUpLook = 250 * time.Millisecond

// untilGiveUp is how long until gaveUp may next be true: the last renewal
// plus --give-up, and at least giveUpLook.
func (r *Run) untilGiveUp() time.Duration {
	return max(time.Until(time.Unix(0, r.lastRenew.Load()).Add(r.cfg.GiveUp)), giveUpLook)
}

// detached records a lost connection, once per loss.
func (r *Run) detached(why string) {
	if r.gaveUp() {
		return // the give-up killed the call; Follow says so next
	}
	if !r.lostSaid.Swap(true) {
		if r.isLaunched() {
			r.cfg.Notice(fmt.Sprintf("run %s: connection to %s lost (%s); reattaching", r.cfg.ID, r.cfg.Dest, why))
		} else {
			until := time.Unix(0, r.lastRenew.Load()).Add(r.cfg.GiveUp).Local()
			r.cfg.Notice(fmt.Sprintf("run %s: cannot reach %s (%s); retrying until %s (--give-up %v); to stop now: Ctrl-C, or kill -INT %d",
				r.cfg.ID, r.cfg.Dest, why, until.Format("15:04:05 MST"), r.cfg.GiveUp, os.Getpid()))
		}
	}
	if r.cfg.Lease < 0 && r.now().phase != phaseDetached {
		r.lastRenew.Store(time.Now().UnixNano()) // no lease: give-up counts from the loss
	}
	if _, ok := r.move(onLost, func(l *ledger.Record, _ runState) { l.Reason = why }); !ok {
		return
	}
	r.ev.emit(EvDetached, map[string]any{"reason": why, "stdout_bytes": r.out.n.Load(), "stderr_bytes": r.errw.n.Load()})
}

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
		f.final = r.cancelFinal.Load()
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

// attachRefused says, once, that the host's agent-wrap has no attach, and
// makes Follow learn the run's end with wait instead.
func (r *Run) attachRefused() {
	if r.noAttach.Swap(true) {
		return
	}
	r.cfg.Notice(fmt.Sprintf("run %s: the agent-wrap on %s has no attach command (it is older than this controller), so the job's output is not streamed", r.cfg.ID, r.cfg.Dest))
	r.cfg.Notice(fmt.Sprintf("hint: 'agent-wrap deploy %s' installs this version; 'agent-wrap ssh' waits for the run's end meanwhile", r.cfg.Dest))
}

// reconcile asks the host for the run's verdict (nil when none came).
func (r *Run) reconcile(ctx context.Context) (*reconcile.Verdict, callResult) {
	return askVerdict(ctx, r.h, r.cfg.ID, r.cfg.Grace+30*time.Second)
}

func askVerdict(ctx context.Context, h *host, id string, timeout time.Duration) (*reconcile.Verdict, callResult) {
	var out, errb bytes.Buffer
	res := h.callTimeout(ctx, timeout, h.remote("reconcile", "--json", id), &out, &errb)
	if res.lost() {
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

// giveUp leaves the run unsettled for settle and returns 255; a run no
// launch attempt can have sent is settled not_started instead (nothing
// will ever start it), so that settle does not wait on a host that may
// never answer.
func (r *Run) giveUp() int {
	reason := fmt.Sprintf("no renewal succeeded for %v (--give-up); the lease has ended the run on the host", r.cfg.GiveUp)
	if !r.isLaunched() && !r.mayHaveSent.Load() {
		reason = fmt.Sprintf("%s could not be reached for %v (--give-up); no attempt got as far as the login, so the command was never sent", r.cfg.Dest, r.cfg.GiveUp)
		r.settle(ledger.NotStarted, -1, "", reason)
		r.cfg.Notice(fmt.Sprintf("run %s: not started: %s", r.cfg.ID, reason))
		return exitcode.Lost
	}
	if !r.isLaunched() {
		reason = fmt.Sprintf("%s could not be reached for %v (--give-up); the run was never seen to start", r.cfg.Dest, r.cfg.GiveUp)
	}
	r.leave(reason)
	return r.unknown(reason)
}

// leave leaves the run unsettled for settle, saying why: the same
// whatever signals arrived, launching for a run never seen to start
// (settle may find it not started), else detached (onGiveUp).
func (r *Run) leave(reason string) {
	r.move(onGiveUp, func(l *ledger.Record, _ runState) {
		l.Reason = reason
		l.ControllerPID, l.ControllerStart = 0, 0
	})
}

// renewLoop renews the lease every RenewEvery over its own connection,
// once the run is launched, until a renewal is refused or ctx ends.
func (r *Run) renewLoop(ctx context.Context) {
	if r.cfg.Lease < 0 {
		return
	}
	select {
	case <-r.launched:
	case <-ctx.Done():
		return
	}
	r.lastRenew.Store(time.Now().UnixNano()) // the launch renewed it
	t := time.NewTimer(r.renewDelay())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.renewNow:
		}
		t.Reset(r.renewDelay())
		nl, ok, why := r.nestedRenewal()
		if !ok {
			r.renewFailed.Store(true)
			r.ev.emit(EvRenewFailed, map[string]any{"reason": "refused", "error": why})
			return
		}
		rr := r.renewCall(ctx, nl) // renewbatch.go
		switch {
		case ctx.Err() != nil:
			return
		case rr.ok:
			r.lastRenew.Store(time.Now().UnixNano())
			var f map[string]any
			if rr.batch > 0 {
				f = map[string]any{"batch": rr.batch}
			}
			r.ev.emit(EvRenewed, f)
			r.attached()
			r.nestedRenewed(nl)
		case rr.lost != "":
			r.ev.emit(EvRenewFailed, map[string]any{"reason": "unreachable", "error": rr.lost})
		default:
			// Refused: the run is terminal, cancelling, or past its
			// deadline. Renewing stops; the stream tells the outcome.
			r.renewFailed.Store(true)
			r.ev.emit(EvRenewFailed, map[string]any{"reason": "refused", "error": rr.refused})
			return
		}
	}
}

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
		res := r.h.callTimeout(ctx, wait+30*time.Second, r.h.remote(words...), &out, &errb)
		if res.code == exitcode.OK {
			line := strings.TrimSpace(out.String())
			if f, ok := parseFinal(r.cfg.ID, line); ok {
				r.cancelFinal.Store(&f)
			}
			close(r.cancelled)
			r.ev.emit(EvCancelConfirmed, map[string]any{"record": line})
			return
		}
		if res.code == exitcode.NoInput {
			return // no such run: nothing to cancel
		}
		if res.code == exitcode.Usage && words[1] == "--json" && olderCancel(errb.String()) {
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

// backoff spaces reattach attempts: the first at once (a lost session is
// most often a master or client that died, replaced in milliseconds), then
// 0.2 s doubling to 5 s.
type backoff struct {
	d       time.Duration
	retried bool // the at-once retry was used
}

func (b *backoff) reset() { b.d, b.retried = 0, false }

// wait sleeps the next interval, ending early when ctx ends.
func (b *backoff) wait(ctx context.Context) {
	if !b.retried {
		b.retried = true
		return
	}
	if b.d == 0 {
		b.d = backoffMin
	} else if b.d *= 2; b.d > backoffMax {
		b.d = backoffMax
	}
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

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
