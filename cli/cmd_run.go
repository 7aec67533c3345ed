package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/wrapper"
)

func init() {
	register(&command{name: "run", summary: "run a job under a lease: run [FLAGS] RUN_ID -- CMD [ARG...]", run: runRun})
}

// durationValue is a pflag value that takes a Go duration ("90s", "5m") or
// a bare number of seconds ("30", "0.5").
type durationValue time.Duration

func (d *durationValue) String() string { return time.Duration(*d).String() }
func (d *durationValue) Type() string   { return "duration" }
func (d *durationValue) Set(s string) error {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if v < 0 {
			return errors.New("must not be negative")
		}
		*d = durationValue(time.Duration(v * float64(time.Second)))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (like 30s, 5m or a number of seconds)")
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	*d = durationValue(v)
	return nil
}

type runFlags struct {
	lease, grace durationValue
	detach       bool
	noStream     bool
	onHangup     string
	cgroup       string
	agent        string
	detachFD     int // set only in the supervisor that --detach starts (detach.go)
}

func runRun(e *Env, args []string) int {
	fs := e.flags("run")
	rf := runFlags{lease: durationValue(5 * time.Minute), grace: durationValue(5 * time.Second)}
	fs.Var(&rf.lease, "lease", "lease `D`: the job is stopped unless renewed before it passes (0: no lease)")
	fs.Var(&rf.grace, "grace", "time `D` between TERM and KILL when stopping")
	fs.BoolVar(&rf.detach, "detach", false, "return once the run is running, printing its record; the supervisor lives on")
	fs.BoolVar(&rf.noStream, "no-stream", false, "do not copy the job's logs to this command's stdout and stderr")
	fs.StringVar(&rf.onHangup, "on-hangup", wrapper.HangupCancel, "on SIGHUP: cancel or ignore")
	fs.StringVar(&rf.cgroup, "cgroup", wrapper.CgroupAuto, "auto: give the run its own cgroup v2 where the host allows it; off: never")
	fs.StringVar(&rf.agent, "agent", "", "scoped: the job gets a relay to $SSH_AUTH_SOCK that ends with the run (the default when it is set); inherit: the socket as is; none: no agent")
	fs.IntVar(&rf.detachFD, "detach-fd", 0, "internal: write the running record to `FD` (the --detach supervisor)")
	_ = fs.MarkHidden("detach-fd")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	args = fs.Args()
	if len(args) == 0 {
		return e.usageError("run needs a RUN_ID and a command")
	}
	id := args[0]
	if err := rundir.ValidID(id); err != nil {
		e.errorf("%v", err)
		e.hint("run IDs match %s", rundir.IDPattern)
		return ExitUsage
	}
	argv := args[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return e.usageError("run %s: no command given", id)
	}
	if rf.onHangup != wrapper.HangupCancel && rf.onHangup != wrapper.HangupIgnore {
		return e.usageError("--on-hangup must be cancel or ignore, not %q", rf.onHangup)
	}
	if rf.cgroup != wrapper.CgroupAuto && rf.cgroup != wrapper.CgroupOff {
		return e.usageError("--cgroup must be auto or off, not %q", rf.cgroup)
	}
	switch rf.agent {
	case "", wrapper.AgentScoped, wrapper.AgentInherit, wrapper.AgentNone:
	default:
		return e.usageError("--agent must be scoped, inherit or none, not %q", rf.agent)
	}
	if rf.detach {
		return e.runDetached(id, argv, rf)
	}

	root, code := e.openRoot(true)
	if root == nil {
		return code
	}
	defer root.Close()

	cfg := wrapper.Config{
		Root:     root,
		ID:       id,
		Argv:     argv,
		Lease:    time.Duration(rf.lease),
		Grace:    time.Duration(rf.grace),
		Stream:   !rf.noStream,
		OnHangup: rf.onHangup,
		Cgroup:   rf.cgroup,
		Agent:    rf.agent,
		Stdout:   e.Stdout,
		Stderr:   e.Stderr,
		Diag:     e.Stderr,
	}
	if f, ok := e.Stdin.(*os.File); ok {
		cfg.Stdin = f
	}
	if rf.detachFD > 2 {
		cfg.Running = detachedRunning(rf.detachFD)
	}
	res, err := wrapper.Run(cfg)
	if err != nil {
		if errors.Is(err, rundir.ErrExists) {
			return e.existingRun(root, id)
		}
		e.errorf("run %s: %v", id, err)
		if rundir.IsUnsafe(err) {
			return ExitUnsafeRoot
		}
		return ExitFailure
	}
	return res.Code
}

// existingRun answers a second `run` with an ID already claimed: the command
// never runs twice. A terminal run returns its recorded code; a live or
// unknown one exits 75 with what to do instead.
func (e *Env) existingRun(root *rundir.Root, id string) int {
	d, err := root.Open(id)
	if err != nil {
		e.errorf("run %s exists but cannot be opened: %v", id, err)
		if rundir.IsUnsafe(err) {
			return ExitUnsafeRoot
		}
		return ExitTempFail
	}
	defer d.Close()
	rec, err := statusfile.Read(d)
	if err != nil {
		e.errorf("run %s already exists and its outcome is unknown: %v", id, err)
		e.hint("the command was not run again; see what happened with 'agent-wrap reconcile %s'", id)
		return ExitTempFail
	}
	if statusfile.Terminal(rec.State) {
		fmt.Fprintf(e.Stderr, "agent-wrap: run %s already %s with exit code %d (ended %s); not running it again\n",
			id, strings.ReplaceAll(rec.State, "_", " "), rec.Code(), rec.EndedAt)
		return rec.Code()
	}
	if membership.WrapperAlive(rec) {
		e.errorf("run %s is already %s (job PID %d, wrapper PID %d); not running it again", id, rec.State, rec.PID, rec.WrapperPID)
		e.hint("follow it with 'agent-wrap logs -f %s' or 'agent-wrap wait %s'", id, id)
		return ExitTempFail
	}
	e.errorf("run %s exists (state %s) but its wrapper is gone; its outcome is unknown; not running it again", id, rec.State)
	e.hint("see what happened with 'agent-wrap reconcile %s'", id)
	return ExitTempFail
}
