//go:build linux

package cli

import (
	"fmt"
	"os"
	"os/exec"
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
		synopsis: "install [--systemd [--timer] | --cron] [--user] [--prefix DIR] [--dry-run]",
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
for --user no crontab program). See deploy/README.md for what goes where.`

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
	if *destRoot == "" {
		*destRoot = e.Getenv("AGENT_WRAP_DESTDIR")
	}
	if *destRoot != "" && !filepath.IsAbs(*destRoot) {
		return e.usageError("--dest-root must be an absolute path, got %q", *destRoot)
	}

	o := deploy.Options{User: *userMode, Timer: *timer, Prefix: *prefix}
	switch {
	case *useSystemd || *timer:
		o.Method = deploy.Systemd
	case *useCron:
		o.Method = deploy.Cron
	case deploy.SystemdRunning():
		o.Method = deploy.Systemd
	default:
		o.Method = deploy.Cron
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

	plan, err := deploy.NewPlan(o)
	if err != nil {
		e.errorf("install: %v", err)
		return ExitUsage
	}

	// A cron line nothing will ever run is a watchdog that never runs:
	// refuse it before writing anything. (Under --dest-root the files are
	// for another system, whose cron this one cannot see.)
	if plan.Method == deploy.Cron && *destRoot == "" {
		if missing := deploy.CronMissing(plan.User); len(missing) > 0 {
			e.errorf("install --cron: nothing here would run the watchdog: missing %s", strings.Join(missing, " and "))
			e.hint("install cron (apt-get install cron), or use --systemd where systemd runs; nothing was installed")
			return ExitFailure
		}
	}
	// The watchdog refuses an unsafe run root, once a minute, forever:
	// refuse it now instead. A missing one is created (0700), so a watchdog
	// started before the first run has a root to open.
	rootCreated := false
	if _, err := os.Lstat(o.RunRoot); err == nil || *dryRun || *destRoot != "" {
		if err == nil {
			r, err := rundir.OpenRoot(o.RunRoot, false)
			if err != nil {
				e.errorf("install: %v", err)
				e.hint("the watchdog would refuse this run root; fix it (a directory of yours, mode 0700) or choose another with --root")
				return ExitUnsafeRoot
			}
			r.Close()
		}
	} else {
		r, err := rundir.OpenRoot(o.RunRoot, true)
		if err != nil {
			e.errorf("install: %v", err)
			return ExitFailure
		}
		r.Close()
		rootCreated = true
	}

	if rootCreated {
		fmt.Fprintf(e.Stdout, "created: %s\n", o.RunRoot)
	}
	changed, err := plan.Apply(e.Stdout, *destRoot, *dryRun)
	if err != nil {
		e.errorf("install: %v", err)
		if os.IsPermission(err) && !*userMode {
			e.hint("a system install needs root; run it as root, or pass --user")
		}
		return ExitFailure
	}
	if rootCreated {
		changed++
	}
	if changed == 0 {
		fmt.Fprintln(e.Stdout, "nothing changed")
	}
	if !*dryRun && *destRoot == "" {
		e.noteReach(plan.Bin)
	}

	// Tell the service manager (or crontab), where there is one to tell and
	// the files were written for real. Otherwise say what to run.
	canActivate := !*dryRun && *destRoot == "" &&
		(plan.Method == deploy.Systemd && deploy.SystemdRunning() ||
			plan.Method == deploy.Cron && haveCommand("crontab"))
	if !canActivate {
		if plan.Activate != "" {
			fmt.Fprintf(e.Stdout, "next: %s\n", plan.Activate)
		}
		if plan.Method == deploy.Systemd && plan.User {
			fmt.Fprintf(e.Stdout, "next: loginctl enable-linger %s  # keeps the watchdog running while %[1]s is logged out\n", o.UserName)
		}
		return ExitOK
	}
	if changed == 0 || plan.Activate == "" {
		return ExitOK // nothing to do, or done by the run that wrote the files
	}
	cmd := exec.CommandContext(e.Ctx, "/bin/sh", "-c", plan.Activate)
	cmd.Stdout, cmd.Stderr = e.Stderr, e.Stderr
	if err := cmd.Run(); err != nil {
		e.errorf("install: %s: %v", plan.Activate, err)
		e.hint("the files are in place; fix the problem and run that command again")
		return ExitFailure
	}
	fmt.Fprintf(e.Stdout, "ran: %s\n", plan.Activate)
	return ExitOK
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

func haveCommand(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}
