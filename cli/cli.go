// Package cli is agent-wrap's command line: it parses arguments, dispatches to
// one command and turns every outcome into an exit code. Nothing in it calls
// os.Exit; main does, once, with what Run returns, so deferred group stops and
// final records always run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Exit codes shared by every command, by the names cli gives them: the
// numbers and what they mean are package exitcode's table (and
// docs/reference.md's). A run's own outcome (the job's code, 128+N, 124,
// 143, ...) is returned as is.
const (
	ExitOK         = exitcode.OK
	ExitFailure    = exitcode.Failure
	ExitRunning    = exitcode.Running  // reconcile: some run is still running
	ExitUnknown    = exitcode.Unknown  // reconcile: some outcome is unknown
	ExitUsage      = exitcode.Usage    // EX_USAGE
	ExitNoRun      = exitcode.NoInput  // EX_NOINPUT: no such run
	ExitNoInput    = exitcode.NoInput  // EX_NOINPUT: a --http secret or CA file is missing, unreadable, unsafe or empty
	ExitSoftware   = exitcode.Software // EX_SOFTWARE: launch failure other than 126/127
	ExitTempFail   = exitcode.TempFail // EX_TEMPFAIL: the ID is live or its outcome unknown
	ExitUnsafeRoot = exitcode.Config   // EX_CONFIG: the run root is unsafe
	// ExitCannot: agent-wrap itself failed before the job could start (the
	// run root or run directory could not be made, the disk is full at the
	// claim), as timeout, env and nohup use 125: a caller over ssh can tell
	// it from every code a job or the shell gives.
	ExitCannot = exitcode.Cannot
)

// Env is what a command sees of the world. Tests build one directly; main
// builds it from the process.
type Env struct {
	Ctx    context.Context
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
	// Exits says the process exits when Run returns (cmd/agent-wrap's
	// main): a run then leaves its signal subscriptions to the exit
	// (wrapper.Config.Exiting).
	Exits bool

	root string // --root given before the command name, if any
	// shortForm: the command line had no command name (agent-wrap RUN_ID
	// CMD...), so run refuses a RUN_ID that looks like a mistyped command.
	shortForm bool
	// describe, when set, gets the FlagSet of the command whose help was
	// asked for, instead of the help being printed (describe.go).
	describe func(fs *pflag.FlagSet)
}

// command is one entry of the dispatch table. Its text fields are what
// `agent-wrap help` and `agent-wrap CMD --help` print, so a new command
// documents itself by filling them in.
type command struct {
	name     string
	summary  string // one line of purpose, lowercase, no period
	synopsis string // the command line after "agent-wrap", e.g. "wait [--timeout D] RUN_ID"
	help     string // optional paragraphs printed between the synopsis and the flags
	exits    string // the exit codes, e.g. "0 renewed; 1 refused; 66 no such run"
	run      func(e *Env, args []string) int
}

// commands is the dispatch table. Each command lives in its own cmd_*.go file
// and adds itself here from an init function, so new commands never edit
// a shared switch.
var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("cli: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// Run executes one agent-wrap command line (without the program name) and
// returns its exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &Env{Ctx: ctx, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	return e.Run(args)
}

// Run is Run with a caller-built Env.
func (e *Env) Run(args []string) int {
	if e.Getenv == nil {
		e.Getenv = os.Getenv
	}
	if e.Ctx == nil {
		e.Ctx = context.Background()
	}
	// Global flags before the command name: only --root (and help).
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "--" && args[0] != "-" {
		a := args[0]
		switch {
		case a == "-h" || a == "--help":
			e.usage(e.Stdout)
			return ExitOK
		case a == "--root":
			if len(args) < 2 {
				return e.usageError("--root needs a directory")
			}
			e.root, args = args[1], args[2:]
		case strings.HasPrefix(a, "--root="):
			e.root, args = strings.TrimPrefix(a, "--root="), args[1:]
		case a == "--version":
			args = append([]string{"version"}, args[1:]...)
		default:
			// Run flags in the short form: agent-wrap --lease 3s ID -- CMD.
			e.shortForm = true
			return commands["run"].run(e, args)
		}
	}
	if len(args) == 0 {
		e.usage(e.Stderr)
		return ExitUsage
	}
	if c, ok := commands[args[0]]; ok {
		return c.run(e, args[1:])
	}
	// The short form: agent-wrap RUN_ID [--] CMD [ARG...].
	if err := rundir.ValidID(args[0]); err != nil {
		e.errorf("%q is neither a command nor a valid run ID: %v", args[0], err)
		e.hint("'agent-wrap help' lists the commands; run IDs match %s", rundir.IDPattern)
		return ExitUsage
	}
	e.shortForm = true
	return commands["run"].run(e, args)
}

// errorf prints "agent-wrap: MESSAGE" to stderr: lowercase, no trailing period.
func (e *Env) errorf(format string, a ...any) {
	fmt.Fprintf(e.Stderr, "agent-wrap: "+format+"\n", a...)
}

// hint prints a line telling the user what to do next.
func (e *Env) hint(format string, a ...any) {
	fmt.Fprintf(e.Stderr, "agent-wrap: hint: "+format+"\n", a...)
}

func (e *Env) usageError(format string, a ...any) int {
	e.errorf(format, a...)
	e.hint("see 'agent-wrap help'")
	return ExitUsage
}

// flags returns a FlagSet for one command with the common --root flag. It
// stops at the first non-flag argument so a job's own flags after RUN_ID are
// never parsed as ours.
func (e *Env) flags(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetInterspersed(false)
	fs.SetOutput(e.Stderr)
	fs.Usage = func() {} // parse prints --help (to stdout) and errors (once)
	fs.StringVar(&e.root, "root", e.root, "run root `DIR` (default $AGENT_WRAP_ROOT, else $HOME/.agent-runs)")
	return fs
}

// parse parses args with fs and reports a usage error as an exit code. ok is
// false when the command must return code at once (help asked, or bad flags).
func (e *Env) parse(fs *pflag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			e.commandHelp(e.Stdout, fs.Name(), fs)
			return ExitOK, false
		}
		e.errorf("%s: %v", fs.Name(), err)
		e.hint("see 'agent-wrap %s --help'", fs.Name())
		return ExitUsage, false
	}
	return 0, true
}

// parseWord is parse for a word of a command (`ledger show`): a word is
// not in the command table, so its --help prints the word's own synopsis,
// summary, help and exit codes.
func (e *Env) parseWord(fs *pflag.FlagSet, args []string, synopsis, summary, help, exits string) (code int, ok bool) {
	if err := fs.Parse(args); errors.Is(err, pflag.ErrHelp) {
		fmt.Fprintf(e.Stdout, "usage: agent-wrap %s\n\n%s\n\n%s\n\nflags:\n", synopsis, summary, help)
		printFlags(e.Stdout, fs)
		fmt.Fprintf(e.Stdout, "\nexit: %s\n", exits)
		return ExitOK, false
	} else if err != nil {
		e.errorf("%s: %v", fs.Name(), err)
		e.hint("see 'agent-wrap %s --help'", fs.Name())
		return ExitUsage, false
	}
	return 0, true
}

// openRoot resolves and opens the run root, creating it when create is set.
// Errors are printed; the second result is the exit code to return.
func (e *Env) openRoot(create bool) (*rundir.Root, int) {
	path, err := rundir.ResolveRoot(e.root, e.Getenv)
	if err != nil {
		e.errorf("%v", err)
		e.hint("pass --root DIR or set AGENT_WRAP_ROOT")
		return nil, ExitUsage
	}
	r, err := rundir.OpenRoot(path, create)
	if err != nil {
		e.errorf("%v", err)
		switch {
		case errors.Is(err, rundir.ErrUnsafe):
			e.hint("the run root must be a real directory owned by you with mode 0700; fix it or choose another with --root")
			return nil, ExitUnsafeRoot
		case create:
			// Nothing was started: agent-wrap's own failure, not the job's.
			e.hint("make %s creatable by you (mode 0700), or choose another run root with --root DIR or AGENT_WRAP_ROOT", path)
			return nil, ExitCannot
		case errors.Is(err, os.ErrNotExist):
			e.hint("there is no run root at %s, so no run was started under it; pass the --root the runs used", path)
			return nil, ExitNoRun
		}
		e.hint("the run root must be a directory of yours, mode 0700, that you can read")
		return nil, ExitFailure
	}
	return r, 0
}

// allRuns opens the root (never creating it) and lists its runs, for a
// command over every run (list, gc, reconcile --all), to which no root yet
// is no runs. Errors are printed. A nil root comes with the exit code to
// return: 0 when there is no root.
func (e *Env) allRuns() (*rundir.Root, []string, int) {
	root, code := e.openRoot(false)
	if root == nil {
		if code == ExitNoRun {
			return nil, nil, ExitOK // no root yet: no runs
		}
		return nil, nil, code
	}
	ids, err := root.List()
	if err != nil {
		root.Close()
		e.errorf("%v", err)
		return nil, nil, ExitFailure
	}
	return root, ids, 0
}
