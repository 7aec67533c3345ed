package cli

import (
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/rundir"
)

func init() {
	register(&command{
		name:     "ssh",
		summary:  "run a job on another host so that it cannot be lost (the controller side)",
		synopsis: "ssh [FLAGS] DEST [--] CMD [ARG...]",
		help:     sshHelp,
		exits:    "the run's exit code, as run gives it; 255 the outcome could not be learned ('agent-wrap settle RUN_ID' asks again), the ledger stayed away past --give-up, or another settle settled the run; 127 the host has no agent-wrap; 75 inside a run that is ending (nothing launched); 64 usage (an --http* flag too), a bad ledger URL or a run ID already in the ledger; 66 an --http-secret or --http-ca that cannot be had (nothing recorded or launched); 77 the database refused access; 78 unsafe ledger, or a database without this version's ledger",
		run:      runSSH,
	})
}

const sshHelp = `ssh runs CMD on DEST under agent-wrap, as 'ssh DEST CMD' would, with the
controller's half of the contract: a ledger record written before the first
connection, lease renewals over their own connections, a reattach from the
byte offsets delivered after a lost connection, and on INT, TERM or HUP a
confirmed remote cancel over a new connection. The job's stdout and stderr
arrive byte for byte, and its stdin is this command's, byte for byte, end of
file included, across reattaches (-n: /dev/null). Output that cannot be
delivered (the reader went away, as with '| head') cancels the run, as ssh's
SIGPIPE would end it; the ledger says so. Inside a run
($AGENT_WRAP_CONTROL set by its wrapper) the run is registered with that run
before the launch, its lease capped at that run's time left, and it is
cancelled before that run stops. The --http* flags are run's (the job gets
a URL, not a token): the secrets and CA files are read here, on the
controller, and sent over the launch connection's stdin, never to the host's
disk or any command line. See docs/controller.md.
`

func runSSH(e *Env, args []string) int {
	fs := e.flags("ssh")
	rsh := fs.StringP("rsh", "e", "", "the ssh command `CMD`, split as a shell would (default $AGENT_WRAP_RSH, else ssh)")
	remoteBin := fs.String("remote-bin", "agent-wrap", "the agent-wrap `PATH` on the host")
	remoteRoot := fs.String("remote-root", "", "the run root `DIR` on the host (default: the host's own)")
	id := fs.String("id", "", "the run `ID` (default: 128 random bits)")
	var lease, grace, renewEvery, giveUp durationValue
	lease, grace = -1, -1
	fs.Var(&lease, "lease", "the run's lease `D` (default 5m; 0: no lease)")
	fs.Var(&grace, "grace", "time `D` between TERM and KILL on the host (default 5s)")
	fs.Var(&renewEvery, "renew-every", "renew the lease every `D` (default a third of the lease)")
	fs.Var(&giveUp, "give-up", "stop trying to learn the outcome `D` after the last renewal that succeeded (default lease + grace + 30s)")
	for _, name := range []string{"lease", "grace", "renew-every", "give-up"} {
		fs.Lookup(name).DefValue = "" // the defaults are in the usage text
	}
	var hf httpgw.Flags
	addHTTPFlags(fs, &hf)     // read here, sent over the launch's stdin (ssh_http.go)
	_ = fs.MarkHidden("root") // the run root is the host's: --remote-root
	agent := fs.String("agent", "", "forward this controller's SSH agent to the job: `MODE` scoped (relayed only while the run is live and leased), inherit, or none (not forwarded); default: not passed, the host's run decides")
	events := fs.String("events", "", "append one JSON line per controller event to `FILE`")
	mux := fs.String("mux", controller.MuxAuto, "`MODE` auto: calls are sessions on agent-wrap's own ssh ControlMasters (unless the --rsh is not OpenSSH's or you set a ControlPath); off: a connection per call")
	oneOf(fs, "agent", controller.AgentScoped, controller.AgentInherit, controller.AgentNone)
	oneOf(fs, "mux", controller.MuxAuto, controller.MuxOff)
	ledgerDir := fs.String("ledger", "", ledgerFlagUsage)
	noStdin := fs.BoolP("no-stdin", "n", false, "the job's stdin is /dev/null, as ssh -n (default: this command's stdin, byte for byte, end of file included; the last bytes sent, up to $AGENT_WRAP_STDIN_KEEP, default 64M, are kept to send again after a lost connection)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) < 2 || rest[1] == "--" && len(rest) < 3 {
		return e.usageError("ssh needs a destination and a command: ssh DEST -- CMD [ARG...]")
	}
	if code, bad := e.flagAfterDest(fs, args, rest); bad {
		return code
	}
	dest, argv := rest[0], rest[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	cfg := controller.Config{Dest: dest, RemoteBin: *remoteBin, RemoteRoot: *remoteRoot, ID: *id,
		Grace: time.Duration(grace), RenewEvery: time.Duration(renewEvery), GiveUp: time.Duration(giveUp),
		Stdout: e.Stdout, Stderr: e.Stderr, Mux: *mux, MuxDir: controller.MuxDir(e.Getenv),
		// Inside a run, the run started here is a handoff of that run.
		Control: e.Getenv(handoff.EnvControl), OuterRunID: e.Getenv(handoff.EnvRunID)}
	if *mux != controller.MuxAuto && *mux != controller.MuxOff {
		return e.usageError("ssh: --mux %q: want %s or %s", *mux, controller.MuxAuto, controller.MuxOff)
	}
	switch {
	case lease < 0:
	case lease == 0:
		cfg.Lease = -1
	default:
		cfg.Lease = time.Duration(lease)
	}
	if grace < 0 {
		cfg.Grace = 0
	}
	if !controller.ValidAgent(*agent) {
		return e.usageError("ssh: --agent %q: want scoped, inherit or none", *agent)
	}
	cfg.Agent, cfg.AgentSocket = *agent, e.Getenv("SSH_AUTH_SOCK")
	if *id != "" {
		if err := rundir.ValidID(*id); err != nil {
			return e.usageError("ssh: --id: %v", err)
		}
	}
	if *rsh == "" {
		*rsh = e.Getenv("AGENT_WRAP_RSH")
	}
	if *rsh != "" {
		words, err := controller.SplitCommand(*rsh)
		if err != nil {
			return e.usageError("ssh: --rsh %q: %v", *rsh, err)
		}
		cfg.Rsh = words
	}
	if !*noStdin {
		if err := controller.CheckRshStdin(cfg.Rsh); err != nil {
			e.errorf("ssh: --rsh: %v, and the job's stdin is sent over it", err)
			e.hint("drop that word from --rsh (or $AGENT_WRAP_RSH), or give -n for a job whose stdin is /dev/null; nothing was recorded or launched")
			return ExitUsage
		}
		keep, err := controller.StdinKeepFromEnv(e.Getenv)
		if err != nil {
			e.errorf("ssh: %v", err)
			e.hint("unset it for the default of 64M; nothing was recorded or launched")
			return ExitUsage
		}
		cfg.StdinKeep = keep
	}
	specs, code := e.sshGateways(hf, cfg.Rsh)
	if code != 0 {
		return code
	}
	cfg.HTTP = specs
	if !*noStdin && e.Stdin != nil {
		cfg.Stdin = e.Stdin // after the gateways' secrets read from it, if any
	}
	l, code := e.openControllerLedger(*ledgerDir)
	if l == nil {
		return code
	}
	defer l.Close()
	cfg.Ledger, cfg.LogDir = l, e.sshLogDir(l)
	if *events != "" {
		f, err := os.OpenFile(*events, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			e.errorf("ssh: --events: %v", err)
			return ExitUsage
		}
		defer f.Close()
		cfg.Events = f
	}

	// Signals before the first record: none is lost between them.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer signal.Stop(sigs)

	run, err := controller.Start(cfg, argv)
	if err != nil {
		e.errorf("ssh: %v", err)
		switch {
		case errors.Is(err, ledger.ErrExists):
			e.hint("the ledger already holds that run; pick another --id, or see it with 'agent-wrap ledger'")
			return ExitUsage
		case errors.Is(err, rundir.ErrBadID):
			return ExitUsage
		case errors.Is(err, controller.ErrMux):
			e.hint("make it a directory of yours with mode 0700 (or name another with AGENT_WRAP_MUX_DIR), or pass --mux off; nothing was started")
			return ExitUnsafeRoot
		case errors.Is(err, ledger.ErrUnreachable):
			e.hint("nothing was launched; run it again once the ledger's database is back")
			return 255
		}
		return e.ledgerHint(err)
	}
	go func() {
		for s := range sigs {
			if s != syscall.SIGPIPE {
				run.Cancel()
			}
		}
	}()
	return run.Follow(e.Ctx)
}
