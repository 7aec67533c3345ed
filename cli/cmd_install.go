//go:build linux

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/agent-wrap/agent-wrap/deploy"
	"github.com/agent-wrap/agent-wrap/rundir"
)

func init() {
	register(&command{
		name:     "install",
		summary:  "install this binary and the watchdog (systemd or cron) on this host",
		synopsis: "install [--systemd [--timer] | --cron | --binary-only] [--user] [--prefix DIR] [--dry-run]",
		help:     installHelp,
		exits:    "0 installed; 1 a file could not be written, the watchdog could not be started, or --cron where no cron would run it; 64 usage; 78 unsafe run root",
		run:      runInstall,
	})
}

const installHelp = `Copies this binary to PREFIX/bin/agent-wrap and installs the watchdog for
the run root (--root, else $AGENT_WRAP_ROOT, else $HOME/.agent-runs): systemd
units, or a cron line. Running it again is safe: unchanged files are left
alone. It prints one line per file, "ran: CMD" when it started the watchdog,
"next: CMD" for what is left to you, and a note when 'ssh HOST agent-wrap'
would not find the binary (non-interactive ssh commands get sshd's PATH).
--cron is refused where nothing would ever run the line (no cron daemon, or
for --user no crontab program). --binary-only, for a host with neither (a
container, a minimal VM), installs the binary alone and prints, as "next:",
the watchdog line to keep running there (a container's entrypoint or
sidecar). See deploy/README.md for what goes where.`

// runInstall puts the running binary and the watchdog in place. See
// deploy/README.md for what goes where and how to undo it.
//
// The hidden --dest-root DIR (or $AGENT_WRAP_DESTDIR) prefixes every path
// written, as DESTDIR does for `make install`: the files name their final
// paths, only where they are written changes. Tests use it; so can packagers.
// With it, install never talks to systemd or crontab.
func runInstall(e *Env, args []string) int {
	fs := e.flags("install")
	useSystemd := fs.Bool("systemd", false, "keep the watchdog running with systemd (default when systemd is running)")
	useCron := fs.Bool("cron", false, "run the watchdog once a minute from cron (default when systemd is not running)")
	timer := fs.Bool("timer", false, "with systemd, enable the once-a-minute timer instead of the long-running service")
	binaryOnly := fs.Bool("binary-only", false, "install the binary alone, where neither systemd nor cron would run the watchdog (a container): it prints the line to keep running")
	userMode := fs.Bool("user", false, "install for this user only: ~/.local, systemd user units or a user crontab")
	prefix := fs.String("prefix", "", "install the binary as `DIR`/bin/agent-wrap (default /usr/local, or ~/.local with --user)")
	dryRun := fs.Bool("dry-run", false, "print what would be done, change nothing")
	destRoot := fs.String("dest-root", "", "write every file under `DIR` (like DESTDIR); for tests and packaging")
	_ = fs.MarkHidden("dest-root")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return e.usageError("install takes no arguments, got %q", fs.Arg(0))
	}
	if *useSystemd && *useCron {
		return e.usageError("--systemd and --cron are exclusive")
	}
	if *timer && *useCron {
		return e.usageError("--timer is a systemd timer; it does not go with --cron")
	}
	if *binaryOnly && (*useSystemd || *useCron || *timer) {
		return e.usageError("--binary-only installs no watchdog; it does not go with --systemd, --cron or --timer")
	}
	if *destRoot == "" {
		*destRoot = e.Getenv("AGENT_WRAP_DESTDIR")
	}
	if *destRoot != "" && !filepath.IsAbs(*destRoot) {
		return e.usageError("--dest-root must be an absolute path, got %q", *destRoot)
	}

	o := deploy.Options{User: *userMode, Timer: *timer, Prefix: *prefix}
	var guessed bool
	if *binaryOnly {
		o.Method = deploy.BinaryOnly
	} else if o.Method, guessed = deploy.ChooseMethod(*useSystemd, *timer, *useCron); guessed && o.Method == deploy.Cron {
		fmt.Fprintln(e.Stdout, "using: cron (systemd is not running here; pass --systemd to install units anyway)")
	}

	// The watchdog watches the run root the installing user's runs use:
	// --root, else $AGENT_WRAP_ROOT, else $HOME/.agent-runs, made absolute
	// and written into the unit or cron line.
	root, err := rundir.ResolveRoot(e.root, e.Getenv)
	if err != nil {
		e.errorf("%v", err)
		e.hint("pass --root DIR or set AGENT_WRAP_ROOT: the watchdog needs to know which run root to watch")
		return ExitUsage
	}
	if o.RunRoot, err = filepath.Abs(root); err != nil {
		e.errorf("%v", err)
		return ExitFailure
	}
	if *userMode {
		o.Home = e.Getenv("HOME")
		if o.Home == "" {
			e.errorf("--user needs $HOME")
			return ExitUsage
		}
	}
	if u, err := user.Current(); err == nil {
		o.UserName = u.Username
	}
	if o.Executable, err = os.Executable(); err != nil {
		e.errorf("cannot find the running binary: %v", err)
		return ExitFailure
	}

	in, err := deploy.Install(o, *destRoot, *dryRun, e.Stdout)
	if err != nil {
		return e.installFailed(err, *userMode)
	}
	if !*dryRun && *destRoot == "" {
		e.noteReach(in.Plan.Bin)
	}
	if err := in.Activate(e.Ctx, e.Stdout, e.Stderr); err != nil {
		return e.installFailed(err, *userMode)
	}
	return ExitOK
}

// installFailed prints an error of deploy.Install or Activate (each a
// deploy.InstallError) with the hint for its step, and returns the exit
// code that step gets.
func (e *Env) installFailed(err error, userMode bool) int {
	var ie *deploy.InstallError
	if !errors.As(err, &ie) {
		ie = &deploy.InstallError{Err: err}
	}
	if ie.Step == deploy.StepCron {
		e.errorf("install --cron: %v", ie.Err)
		e.hint("install cron (apt-get install cron), or use --systemd where systemd runs; nothing was installed")
		e.hint("where neither runs (a container, a minimal VM): install --binary-only installs the binary alone and prints the watchdog line to keep running (an entrypoint or a sidecar)")
		return ExitFailure
	}
	e.errorf("install: %v", ie.Err)
	switch ie.Step {
	case deploy.StepPlan:
		return ExitUsage
	case deploy.StepRoot:
		e.hint("the watchdog would refuse this run root; fix it (a directory of yours, mode 0700) or choose another with --root")
		return ExitUnsafeRoot
	case deploy.StepWrite:
		if os.IsPermission(ie.Err) && !userMode {
			e.hint("a system install needs root; run it as root, or pass --user")
		}
	case deploy.StepActivate:
		e.hint("the files are in place; fix the problem and run that command again")
	}
	return ExitFailure
}

// noteReach says so when a controller's `ssh HOST agent-wrap` would not find
// bin: a non-interactive ssh command gets sshd's default PATH. This is a
// prediction from this side; deploy checks over ssh itself.
func (e *Env) noteReach(bin string) {
	r := deploy.LocalReach(bin, deploy.SSHDefaultPath(os.Geteuid()), e.Getenv("HOME"), e.Getenv("SHELL"))
	if r.OnPath() {
		return
	}
	fmt.Fprintf(e.Stdout, "note: 'ssh HOST agent-wrap' will not find %s: a non-interactive ssh command gets sshd's PATH (%s on Debian)\n",
		bin, strings.Join(r.Path, ":"))
	for _, f := range r.Fixes() {
		fmt.Fprintf(e.Stdout, "note: %s\n", f)
	}
}
