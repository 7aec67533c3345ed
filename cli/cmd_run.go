//go:build linux

package cli

import (
	"errors"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/wrapper"
)

func init() {
	register(&command{
		name:     "run",
		summary:  "run a job under a lease, in a new session, recorded in ROOT/RUN_ID",
		synopsis: "run [FLAGS] RUN_ID [FLAGS] -- CMD [ARG...]\n       agent-wrap [--root DIR] RUN_ID [FLAGS] [--] CMD [ARG...]",
		help:     runHelp,
		exits: "the job's code; 128+N the job died of signal N; 143/130/129 cancelled by TERM/INT/HUP; " +
			"124 lease expired; 127/126 command not found/not executable; 70 other launch failure; " +
			"75 the ID is taken by a live run or one whose outcome is unknown; 64 usage; 78 unsafe run root; " +
			"125 agent-wrap failed before the job could start",
		run: runRun,
	})
}

const runHelp = `run claims RUN_ID (the directory ROOT/RUN_ID: an ID is used once, ever),
starts CMD in a session of its own, streams its output here while it can,
and stops the whole process group (TERM, grace, KILL) when the lease passes,
on a cancel, or on TERM, INT or HUP to agent-wrap. Run the same ID again and
the command is not run twice: you get the recorded outcome.

Flags may stand before RUN_ID, or between RUN_ID and a "--" that ends them.
Every usage error is found before the claim, so a mistake never uses up an
ID. In the short form (no "run"), a RUN_ID that is a command name or one or
two typing slips from one is refused: say "run" to use it.`

// run --stdin modes.
const (
	stdinInherit = "inherit"
	stdinNull    = "null"
	stdinPipe    = "pipe"
)

type runFlags struct {
	lease, grace durationValue
	detach       bool
	noStream     bool
	onHangup     string
	cgroup       string
	agent        string
	stdin        string // --stdin: inherit, null or pipe
	detachFD     int    // set only in the supervisor that --detach starts (detach.go)
	// handoffGrace is --handoff-grace; -1: not given (the grace).
	handoffGrace durationValue
	http         httpgw.Flags // --http* (http_flags.go)
	httpFD       int          // set only in the --detach supervisor: the gateways' secrets on this FD
}

func runRun(e *Env, args []string) int {
	fs := e.flags("run")
	rf := runFlags{lease: durationValue(5 * time.Minute), grace: durationValue(5 * time.Second), handoffGrace: -1}
	fs.Var(&rf.lease, "lease", "lease `D`: the job is stopped unless renewed before it passes (0: no lease)")
	fs.Var(&rf.grace, "grace", "time `D` between TERM and KILL when stopping")
	fs.BoolVar(&rf.detach, "detach", false, "return once the run is running, printing its record; the supervisor lives on")
	fs.BoolVar(&rf.noStream, "no-stream", false, "do not copy the job's logs to this command's stdout and stderr")
	fs.StringVar(&rf.onHangup, "on-hangup", wrapper.HangupCancel, "on SIGHUP: cancel or ignore")
	fs.StringVar(&rf.cgroup, "cgroup", wrapper.CgroupAuto, "auto: give the run its own cgroup v2 where the host allows it; off: never")
	fs.StringVar(&rf.agent, "agent", "", "scoped: the job gets a relay to $SSH_AUTH_SOCK that ends with the run (the default when it is set); inherit: the socket as is; none: no agent")
	oneOf(fs, "on-hangup", wrapper.HangupCancel, wrapper.HangupIgnore)
	oneOf(fs, "cgroup", wrapper.CgroupAuto, wrapper.CgroupOff)
	oneOf(fs, "agent", wrapper.AgentScoped, wrapper.AgentInherit, wrapper.AgentNone)
	fs.Var(&rf.handoffGrace, "handoff-grace", "at a stop, wait up to `D` for the runs the job started on other hosts (agent-wrap ssh) to confirm their cancel, before signalling the group (default: the grace)")
	fs.Lookup("handoff-grace").DefValue = ""
	fs.StringVar(&rf.stdin, "stdin", stdinInherit, "the job's stdin: inherit (this command's own; /dev/null with --detach), null (/dev/null), or pipe (a pipe the wrapper feeds from 'attach --stdin-from', as agent-wrap ssh does)")
	fs.IntVar(&rf.detachFD, "detach-fd", 0, "internal: write the running record to `FD` (the --detach supervisor)")
	_ = fs.MarkHidden("detach-fd")
	addHTTPFlags(fs, &rf.http)
	fs.IntVar(&rf.httpFD, "http-fd", 0, "internal: read the gateways' secrets from `FD` (the --detach supervisor)")
	_ = fs.MarkHidden("http-fd")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if rf.detachFD > 2 {
		restoreGOMAXPROCS() // the caller's, for the job (detach.go)
	}
	id, argv, code := e.runArgs(fs, fs.Args())
	if code != 0 {
		return code
	}
	if rf.onHangup != wrapper.HangupCancel && rf.onHangup != wrapper.HangupIgnore {
		return e.usageError("--on-hangup must be cancel or ignore, not %q", rf.onHangup)
	}
	if rf.cgroup != wrapper.CgroupAuto && rf.cgroup != wrapper.CgroupOff {
		return e.usageError("--cgroup must be auto or off, not %q", rf.cgroup)
	}
	switch rf.stdin {
	case stdinInherit, stdinNull, stdinPipe:
	default:
		return e.usageError("--stdin must be inherit, null or pipe, not %q", rf.stdin)
	}
	switch rf.agent {
	case "", wrapper.AgentScoped, wrapper.AgentInherit, wrapper.AgentNone:
	default:
		return e.usageError("--agent must be scoped, inherit or none, not %q", rf.agent)
	}
	if rf.agent != "" && rf.agent != wrapper.AgentNone && e.Getenv("SSH_AUTH_SOCK") == "" && rf.detachFD == 0 {
		// Asked for an agent there is none of: the job runs with none. Said
		// once, by the command the user typed (not its --detach supervisor).
		e.errorf("warning: --agent %s, but SSH_AUTH_SOCK is not set: the job gets no agent", rf.agent)
		e.hint("start an ssh-agent (or connect with ssh -A) to give the job one; --agent none says no agent without this warning")
	}
	specs, code := e.httpSpecs(rf.http)
	if code != 0 {
		return code
	}
	if rf.httpFD > 2 {
		code = e.loadPassedHTTP(specs, rf.httpFD)
	} else {
		code = e.loadHTTP(specs, e.Stdin)
	}
	if code != 0 {
		return code
	}
	if rf.detach {
		return e.runDetached(id, argv, rf, specs)
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
		HTTP:     specs,
		Stdout:   e.Stdout,
		Stderr:   e.Stderr,
		Diag:     e.Stderr,
		Exiting:  e.Exits,
	}
	cfg.HandoffGrace = rf.handoffGraceConfig()
	switch rf.stdin {
	case stdinPipe:
		cfg.StdinPipe = true
	case stdinInherit:
		if f, ok := e.Stdin.(*os.File); ok {
			cfg.Stdin = f
		}
	}
	if rf.detachFD > 2 {
		cfg.Running = detachedRunning(rf.detachFD)
	}
	res, err := wrapper.Run(cfg)
	if err != nil {
		if errors.Is(err, rundir.ErrExists) {
			return e.existingRun(root, id)
		}
		// Nothing was started. The error names the run and the path.
		e.errorf("run %s not started: %v", id, err)
		if errors.Is(err, rundir.ErrUnsafe) {
			return ExitUnsafeRoot
		}
		if rundir.NoSpace(err) {
			e.hint("the file system of %s is full: the job did not run, its run directory was removed and the ID %s is free; free some space and run it again", root.Path, id)
			return ExitCannot
		}
		e.hint("the job did not run and can be run again under the same ID once %s is writable (and has space), or choose another run root with --root DIR", root.Path)
		return ExitCannot
	}
	return res.Code
}

// runArgs takes what follows run's leading flags, RUN_ID [FLAGS] [--] CMD
// [ARG...], parses flags that stand between RUN_ID and "--" into fs, and
// returns the ID and the job's argv. Every check of the command line is
// here, before anything is claimed; code is non-zero (and printed) when the
// line is refused.
func (e *Env) runArgs(fs *pflag.FlagSet, args []string) (id string, argv []string, code int) {
	if len(args) == 0 {
		return "", nil, e.usageError("run needs a RUN_ID and a command")
	}
	id, rest := args[0], args[1:]
	if code := e.checkIDs(id); code != 0 {
		return "", nil, code
	}
	if e.shortForm {
		if near := nearCommands(id); len(near) > 0 {
			return "", nil, e.refuseNearCommand(id, near, rest)
		}
	}
	// Flags between RUN_ID and "--" are run's flags: `ID --lease 1s -- CMD`.
	if len(rest) > 0 && rest[0] != "--" && strings.HasPrefix(rest[0], "-") {
		end := slices.Index(rest, "--")
		if end < 0 {
			e.errorf("%q after RUN_ID %s starts with '-', so it is not a command; flags there must end with \"--\"", rest[0], id)
			fixed := "agent-wrap " + id + " [FLAGS] -- CMD [ARG...]"
			if err := fs.Parse(rest); err == nil && fs.NArg() > 0 {
				n := len(rest) - fs.NArg()
				fixed = shellLine(slices.Concat([]string{"agent-wrap", id}, rest[:n], []string{"--"}, rest[n:]))
			}
			e.hint("nothing was run and the ID %s is still free; did you mean: %s", id, fixed)
			return "", nil, ExitUsage
		}
		if c, ok := e.parse(fs, rest[:end]); !ok {
			return "", nil, c
		}
		if fs.NArg() > 0 {
			e.errorf("%q between RUN_ID %s and \"--\" is not a flag of run", fs.Arg(0), id)
			e.hint("the command goes after \"--\": agent-wrap run %s [FLAGS] -- CMD [ARG...]", id)
			return "", nil, ExitUsage
		}
		rest = rest[end:]
	}
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		if e.shortForm {
			e.errorf("%q is not a command, and as a run ID it has no command to run", id)
			e.hint("'agent-wrap help' lists the commands; to run a job: agent-wrap %s -- CMD [ARG...]", id)
			return "", nil, ExitUsage
		}
		return "", nil, e.usageError("run %s: no command given", id)
	}
	if strings.HasPrefix(rest[0], "-") {
		e.errorf("the command %q starts with '-': it is not a program but a flag", rest[0])
		e.hint("flags of run go before \"--\", the command after it: agent-wrap run [FLAGS] %s -- CMD [ARG...]", id)
		return "", nil, ExitUsage
	}
	return id, rest, 0
}

// refuseNearCommand refuses a short-form RUN_ID that is a command name or a
// slip from one, naming the commands meant and the explicit form that runs
// the job under that ID anyway.
func (e *Env) refuseNearCommand(id string, near []string, rest []string) int {
	if slices.Contains(near, id) {
		e.errorf("%q is a command, so it cannot be a run ID in the short form", id)
	} else {
		e.errorf("%q is not a command; did you mean %s?", id, orList(near))
	}
	job := rest
	if len(job) > 0 && job[0] == "--" {
		job = job[1:]
	}
	switch {
	case len(job) > 0 && strings.HasPrefix(job[0], "-"):
		// `stauts --help`: a flag is no job, so the run form would be
		// refused too; offer the command meant, with the same words.
		var lines []string
		for _, n := range near {
			lines = append(lines, shellLine(slices.Concat([]string{"agent-wrap", n}, rest)))
		}
		e.hint("did you mean: %s", strings.Join(lines, " or "))
	case len(job) > 0:
		e.hint("to run a job under the run ID %s, name the run command: agent-wrap run %s -- %s", id, id, shellLine(job))
	default:
		e.hint("to run a job under the run ID %s, name the run command: agent-wrap run %s -- CMD [ARG...]", id, id)
	}
	e.hint("nothing was run and the ID %s is still free", id)
	return ExitUsage
}

// handoffGraceConfig maps --handoff-grace to wrapper.Config.HandoffGrace:
// not given is 0 (the grace), an explicit 0 is no wait at all.
func (rf *runFlags) handoffGraceConfig() time.Duration {
	switch {
	case rf.handoffGrace < 0:
		return 0
	case rf.handoffGrace == 0:
		return -1
	}
	return time.Duration(rf.handoffGrace)
}
