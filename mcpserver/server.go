package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/mcpserver/config"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// version is stamped at build time (-X .../mcpserver.version=...).
var version = "dev"

// Server is one agent-wrap-mcp: its command line, its ledger, and the runs
// it started.
type Server struct {
	cfg    config.Config
	getenv func(string) string
	rsh    []string
	stderr io.Writer

	store    ledger.Store // nil when it could not be opened: storeErr says why
	storeErr error
	logDir   string    // ssh's -E logs (controller.Config.LogDir)
	outDir   string    // the runs' output files, removed by Close
	events   io.Writer // --events, or nil

	bg context.Context // Follow's: never cancelled while the server lives

	mu      sync.Mutex
	runs    map[string]*liveRun
	follows sync.WaitGroup

	mcp *mcp.Server
}

// New checks cfg, opens the ledger (an error there is kept and given as
// each call's error, so the agent sees it) and makes the server's private
// output directory. An error means nothing was made.
func New(cfg config.Config, getenv func(string) string, stderr io.Writer) (*Server, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, getenv: getenv, stderr: stderr, bg: context.Background(), runs: map[string]*liveRun{}}
	rsh := cfg.Rsh
	if rsh == "" {
		rsh = getenv("AGENT_WRAP_RSH")
	}
	if rsh != "" {
		words, err := controller.SplitCommand(rsh)
		if err != nil {
			return nil, fmt.Errorf("--rsh %q: %v", rsh, err)
		}
		s.rsh = words
	}
	dir, err := os.MkdirTemp("", "agent-wrap-mcp-")
	if err != nil {
		return nil, fmt.Errorf("cannot make a directory for the runs' output: %w", err)
	}
	s.outDir, s.logDir = dir, dir
	if cfg.Events != "" {
		f, err := os.OpenFile(cfg.Events, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("--events: %w", err)
		}
		s.events = &lockedWriter{w: f}
	}
	s.openLedger()
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "agent-wrap", Title: "agent-wrap: runs over ssh whose cancel is confirmed", Version: version},
		&mcp.ServerOptions{Instructions: instructions})
	s.addTools()
	return s, nil
}

const instructions = `Run commands on remote hosts over ssh under agent-wrap: each run is leased, recorded in a ledger before it starts, and its cancel is a confirmed stop of the whole remote process tree. Use run (it waits up to wait_seconds), then wait or logs for a run still going, cancel to stop one (the result says whether the stop was confirmed), status for the host's verdict, list for the ledger. Cancelling a run or wait request cancels that run on its host.`

// openLedger opens the controller's ledger as agent-wrap ssh does: a
// directory made if missing, a database connected to at the first write.
func (s *Server) openLedger() {
	where, err := ledger.Resolve(s.cfg.Ledger, s.getenv)
	if err != nil {
		s.storeErr = fmt.Errorf("%v; pass --ledger DIR to agent-wrap mcp, or set AGENT_WRAP_LEDGER", err)
		return
	}
	l, err := ledger.OpenForController(context.Background(), where)
	if err != nil {
		s.storeErr = ledgerError(err)
		return
	}
	s.store = l
	if f, ok := l.(*ledger.Ledger); ok {
		s.logDir = f.Path
	}
}

// ledgerError is a ledger's refusal with the next step, as agent-wrap's
// own commands give it.
func ledgerError(err error) error {
	hint := "fix the ledger, or start agent-wrap mcp with another --ledger"
	switch {
	case errors.Is(err, rundir.ErrUnsafe):
		hint = "the ledger must be a real directory owned by this user with mode 0700; fix it or start agent-wrap mcp with another --ledger"
	case errors.Is(err, ledger.ErrBadURL):
		hint = "a ledger URL is postgres://USER@HOST[:PORT]/DATABASE[?sslmode=...]"
	case errors.Is(err, ledger.ErrNoSchema):
		hint = "run 'agent-wrap ledger init' with this --ledger once"
	case errors.Is(err, ledger.ErrDenied):
		hint = "check the database user, its password (PGPASSWORD, PGPASSFILE) and its grants"
	case errors.Is(err, ledger.ErrUnreachable):
		hint = "is the database up? runs are refused until it is"
	}
	return fmt.Errorf("the ledger cannot be opened: %v; %s", err, hint)
}

// notice is the controller's own words, to stderr.
func (s *Server) notice(msg string) {
	fmt.Fprintf(s.stderr, "agent-wrap-mcp: %s\n", msg)
}

// Serve answers one client on t until it goes away or ctx ends.
func (s *Server) Serve(ctx context.Context, t mcp.Transport) error {
	err := s.mcp.Run(ctx, t)
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// Close ends the server as --on-exit says: cancel every live run this
// server started and wait until each is settled (cancel), or leave them
// to their leases (keep); then the output directory is removed and the
// ledger closed.
func (s *Server) Close() {
	s.mu.Lock()
	var live []*liveRun
	for _, lr := range s.runs {
		if !lr.isDone() {
			live = append(live, lr)
		}
	}
	s.mu.Unlock()
	if s.cfg.OnExit == config.OnExitKeep {
		for _, lr := range live {
			s.notice(fmt.Sprintf("run %s on %s: left to its lease (--on-exit keep); 'agent-wrap settle %s' learns its outcome", lr.id(), lr.dest, lr.id()))
		}
	} else {
		for _, lr := range live {
			lr.cancel(cancelByExit, 0)
		}
		s.follows.Wait()
	}
	for _, lr := range s.all() {
		lr.out.close()
		lr.errs.close()
	}
	os.RemoveAll(s.outDir)
	if s.store != nil && s.cfg.OnExit != config.OnExitKeep {
		s.store.Close()
	}
}

// Who asked for a run's cancel.
const (
	cancelByClient = "client" // the client cancelled the run or wait request
	cancelByTool   = "tool"   // the cancel tool
	cancelByExit   = "exit"   // the client went away (--on-exit cancel)
	cancelByLaunch = "launch" // the host could not be reached at the launch
)

func (s *Server) all() []*liveRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*liveRun, 0, len(s.runs))
	for _, lr := range s.runs {
		out = append(out, lr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id() < out[j].id() })
	return out
}

func (s *Server) live(id string) *liveRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// ledgerOrErr is the ledger, or the reason it could not be opened.
func (s *Server) ledgerOrErr() (ledger.Store, error) {
	if s.store == nil {
		return nil, s.storeErr
	}
	return s.store, nil
}

// checkAllowed refuses every call without --allow, and a destination no
// pattern matches.
func (s *Server) checkAllowed(dest string) error {
	if len(s.cfg.Allow) == 0 {
		return errors.New("no destination is allowed: this server was started without --allow; restart it with --allow PATTERN (a shell glob on the destination, such as 'build@*.ci')")
	}
	if dest != "" && !s.cfg.Allowed(dest) {
		return fmt.Errorf("destination %q is not allowed (--allow %s); nothing was started; use a destination that matches, or restart the server with another --allow", dest, strings.Join(s.cfg.Allow, ", --allow "))
	}
	return nil
}

// start writes the run's launching record and starts following it.
func (s *Server) start(dest, id string, argv []string, stdin string, lease, grace time.Duration) (*liveRun, error) {
	store, err := s.ledgerOrErr()
	if err != nil {
		return nil, err
	}
	if id == "" {
		id = ledger.NewID()
	}
	lr := &liveRun{dest: dest, launched: make(chan struct{}), lost: make(chan string, 1), done: make(chan struct{})}
	out, errs, err := outputFiles(s.outDir, id, lr.setLast)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("run ID %q was already used by this server; leave run_id out for a fresh one", id)
		}
		return nil, fmt.Errorf("cannot keep the run's output: %v", err)
	}
	lr.out, lr.errs = out, errs
	cfg := controller.Config{
		Rsh: s.rsh, Dest: dest, RemoteBin: s.cfg.RemoteBin, RemoteRoot: s.cfg.RemoteRoot, ID: id,
		Lease: lease, Grace: grace,
		RenewEvery: config.Duration(s.cfg.RenewEvery, 0), GiveUp: config.Duration(s.cfg.GiveUp, 0),
		Mux: s.cfg.Mux, MuxDir: controller.MuxDir(s.getenv),
		Ledger: store, LogDir: s.logDir,
		Events: &eventHook{lr: lr, out: s.events},
		Stdout: out, Stderr: errs, Notice: s.notice,
		Control: s.getenv(handoff.EnvControl), OuterRunID: s.getenv(handoff.EnvRunID),
	}
	if stdin != "" {
		// The job's stdin, as `agent-wrap ssh` gives it: byte for byte,
		// then end of file, resumed across reattaches (nil: /dev/null).
		cfg.Stdin = strings.NewReader(stdin)
	}
	run, err := controller.Start(cfg, argv)
	if err != nil {
		out.close()
		errs.close()
		os.Remove(out.f.Name())
		os.Remove(errs.f.Name())
		switch {
		case errors.Is(err, ledger.ErrExists):
			return nil, fmt.Errorf("run ID %q is already in the ledger; nothing was started; leave run_id out for a fresh one, or look at that run with status", id)
		case errors.Is(err, ledger.ErrUnreachable):
			return nil, fmt.Errorf("%v; nothing was started; call run again once the ledger's database is back", err)
		}
		return nil, fmt.Errorf("%v; nothing was started", err)
	}
	lr.run = run
	s.mu.Lock()
	s.runs[id] = lr
	s.mu.Unlock()
	s.follows.Add(1)
	go func() {
		defer s.follows.Done()
		lr.code = run.Follow(s.bg)
		close(lr.done)
	}()
	return lr, nil
}
