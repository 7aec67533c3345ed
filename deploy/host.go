package deploy

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/agent-wrap/agent-wrap/rundir"
)

// ChooseMethod is how an install keeps the watchdog running: systemd when
// asked for it (or for its timer), cron when asked, and otherwise systemd
// where it is the running service manager, cron elsewhere. guessed says
// the caller asked for neither.
func ChooseMethod(systemd, timer, cron bool) (m Method, guessed bool) {
	switch {
	case systemd || timer:
		return Systemd, false
	case cron:
		return Cron, false
	case SystemdRunning():
		return Systemd, true
	}
	return Cron, true
}

// Step is a step of Install, named in an InstallError.
type Step int

const (
	// StepPlan: the request itself is refused (NewPlan): a path that would
	// need quoting, a bad user name, an unreadable executable.
	StepPlan Step = iota + 1
	// StepCron: cron was asked for where nothing would run its line.
	StepCron
	// StepRoot: the run root exists and the watchdog would refuse it.
	StepRoot
	// StepCreateRoot: the missing run root could not be created.
	StepCreateRoot
	// StepWrite: a file could not be written (Plan.Apply).
	StepWrite
	// StepActivate: the activation command failed; the files are in place.
	StepActivate
)

// InstallError is an install that stopped at Step; nothing after that step
// was done, and before StepWrite nothing was written.
type InstallError struct {
	Step Step
	Err  error
}

func (e *InstallError) Error() string { return e.Err.Error() }
func (e *InstallError) Unwrap() error { return e.Err }

// CronMissingError says what this host lacks for cron to run the watchdog
// (CronMissing).
type CronMissingError struct{ Missing []string }

func (e *CronMissingError) Error() string {
	return "nothing here would run the watchdog: missing " + strings.Join(e.Missing, " and ")
}

// Installed is an install whose files are in place (or, with DryRun, would
// be), ready for Activate.
type Installed struct {
	Plan        *Plan
	RootCreated bool // the run root was missing and was created (0700)
	Changed     int  // files (and the run root) written, or that would be
	// Ran is the activation command Activate ran; "" if it ran none.
	Ran string

	destRoot string
	dryRun   bool
	userName string
}

// Install puts the binary and the watchdog in place on this host, as o
// says, and prints what it did to w, one line each: "created: ROOT" for a
// run root it made, Plan.Apply's lines, and "nothing changed" when nothing
// did. destRoot and dryRun are Plan.Apply's.
//
// It refuses before writing anything a plan NewPlan refuses, a cron
// install where nothing would run the line (not checked under destRoot:
// the files are for another system), and an existing run root the
// watchdog would refuse, which it would do once a minute, forever. A
// missing run root is created (0700, unless destRoot or dryRun), so a
// watchdog started before the first run has a root to open. Every error
// is an *InstallError.
func Install(o Options, destRoot string, dryRun bool, w io.Writer) (*Installed, error) {
	plan, err := NewPlan(o)
	if err != nil {
		return nil, &InstallError{StepPlan, err}
	}
	in := &Installed{Plan: plan, destRoot: destRoot, dryRun: dryRun, userName: o.UserName}
	if plan.Method == Cron && destRoot == "" {
		if missing := CronMissing(plan.User); len(missing) > 0 {
			return nil, &InstallError{StepCron, &CronMissingError{missing}}
		}
	}
	if _, err := os.Lstat(o.RunRoot); err == nil || dryRun || destRoot != "" {
		if err == nil {
			r, err := rundir.OpenRoot(o.RunRoot, false)
			if err != nil {
				return nil, &InstallError{StepRoot, err}
			}
			r.Close()
		}
	} else {
		r, err := rundir.OpenRoot(o.RunRoot, true)
		if err != nil {
			return nil, &InstallError{StepCreateRoot, err}
		}
		r.Close()
		in.RootCreated = true
		fmt.Fprintf(w, "created: %s\n", o.RunRoot)
	}
	if in.Changed, err = plan.Apply(w, destRoot, dryRun); err != nil {
		return nil, &InstallError{StepWrite, err}
	}
	if in.RootCreated {
		in.Changed++
	}
	if in.Changed == 0 {
		fmt.Fprintln(w, "nothing changed")
	}
	return in, nil
}

// Activate tells the service manager (or crontab) to start what was
// installed, where there is one to tell and the files were written for
// real: it runs Plan.Activate through /bin/sh, its output going to diag,
// and prints "ran: CMD" to w. It runs nothing when nothing changed or
// there is nothing to run. Otherwise (a dry run, destRoot, no systemd
// running, no crontab program) it prints "next: CMD" for the operator,
// and for systemd user units the loginctl line that keeps them running
// while the user is logged out. A failed command is an *InstallError
// (StepActivate).
func (in *Installed) Activate(ctx context.Context, w, diag io.Writer) error {
	p := in.Plan
	if p.Method == BinaryOnly {
		// Nothing here runs it: the operator's line, said every time.
		fmt.Fprintln(w, "watchdog: nothing here keeps it running (binary only); keep the next line running as a long-lived process: a container's entrypoint or sidecar, or a supervisor's program")
		fmt.Fprintf(w, "next: %s\n", p.Keep)
		return nil
	}
	canActivate := !in.dryRun && in.destRoot == "" &&
		(p.Method == Systemd && SystemdRunning() ||
			p.Method == Cron && haveCommand("crontab"))
	if !canActivate {
		if p.Activate != "" {
			fmt.Fprintf(w, "next: %s\n", p.Activate)
		}
		if p.Method == Systemd && p.User {
			fmt.Fprintf(w, "next: loginctl enable-linger %s  # keeps the watchdog running while %[1]s is logged out\n", in.userName)
		}
		return nil
	}
	if in.Changed == 0 || p.Activate == "" {
		return nil // nothing to do, or done by the run that wrote the files
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", p.Activate)
	cmd.Stdout, cmd.Stderr = diag, diag
	if err := cmd.Run(); err != nil {
		return &InstallError{StepActivate, fmt.Errorf("%s: %w", p.Activate, err)}
	}
	in.Ran = p.Activate
	fmt.Fprintf(w, "ran: %s\n", p.Activate)
	return nil
}

func haveCommand(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}
