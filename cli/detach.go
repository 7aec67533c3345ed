//go:build linux

package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// run --detach: the caller starts a second agent-wrap, the supervisor, as
//
//	agent-wrap --root ROOT run --no-stream --lease L --grace G --on-hangup H --detach-fd 3 ID -- CMD...
//
// in a session of its own (setsid), stdin and stdout on /dev/null, stderr a
// pipe back to the caller and fd 3 the write end of a second pipe. When the
// run is `running`, the supervisor's Running callback points its stderr at
// /dev/null and writes the record to fd 3, then closes it; the caller prints
// that record and returns 0, and the supervisor lives on with no tie to it.
// If fd 3 closes without a record, the supervisor has exited before the run
// was running (launch failure, the ID taken meanwhile, an unsafe root): the
// caller has relayed its messages, waits for it and returns its exit code.
//
// The job sees nothing of this: no environment variable is added, and fd 3
// is close-on-exec by the time the job starts (the wrapper marks every fd
// from 3 up close-on-exec before it forks the job).

// detachFD is the descriptor number the supervisor reports on; httpFD the
// one it reads the gateways' secrets from.
const (
	detachFD = 3
	httpFD   = 4
)

// withoutVars is env without the variables named.
func withoutVars(env, names []string) []string {
	if len(names) == 0 {
		return env
	}
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(names, name) {
			out = append(out, kv)
		}
	}
	return out
}

// The supervisor runs on one processor from its first instruction: its
// environment says GOMAXPROCS=1, and the caller's own GOMAXPROCS (or that
// it had none) is saved beside it in envSavedGOMAXPROCS, for the supervisor
// to put back (restoreGOMAXPROCS) before anything reads its environment
// for the job. A wrapper needs no second processor, and a runtime that
// never had one keeps less: 10 quiet wrappers side by side kept 1164 kB
// RssAnon each against 1404 with two (a runtime.GOMAXPROCS(1) once
// running kept 1720: the change of processors costs more than it saves).
const envSavedGOMAXPROCS = "AGENT_WRAP_SAVED_GOMAXPROCS"

// oneProcessor returns env with its first GOMAXPROCS set to 1 (added at
// the end when it has none) and the caller's saved: "+VALUE", or "-" for
// none.
func oneProcessor(env []string) []string {
	out := make([]string, 0, len(env)+2)
	saved := "-"
	for _, kv := range env {
		if strings.HasPrefix(kv, envSavedGOMAXPROCS+"=") {
			continue
		}
		if v, ok := strings.CutPrefix(kv, "GOMAXPROCS="); ok && saved == "-" {
			saved, kv = "+"+v, "GOMAXPROCS=1"
		}
		out = append(out, kv)
	}
	if saved == "-" {
		out = append(out, "GOMAXPROCS=1")
	}
	return append(out, envSavedGOMAXPROCS+"="+saved)
}

// restoreGOMAXPROCS is the supervisor's side of oneProcessor: the caller's
// GOMAXPROCS, or its absence, is put back in the process's environment,
// where the job's is taken from, each variable in its place.
func restoreGOMAXPROCS() {
	saved, ok := os.LookupEnv(envSavedGOMAXPROCS)
	if !ok {
		return
	}
	os.Unsetenv(envSavedGOMAXPROCS)
	if v, was := strings.CutPrefix(saved, "+"); was {
		os.Setenv("GOMAXPROCS", v)
	} else {
		os.Unsetenv("GOMAXPROCS")
	}
}

// loadPassedHTTP is the supervisor's side: the secrets the caller read,
// from fd, before the claim.
func (e *Env) loadPassedHTTP(specs []*httpgw.Spec, fd int) int {
	f := os.NewFile(uintptr(fd), "http-secrets")
	if f == nil || len(specs) == 0 {
		return 0
	}
	defer f.Close()
	if err := httpgw.NoDump(); err != nil {
		e.errorf("cannot protect the gateway secrets: %v", err)
		return ExitCannot
	}
	if err := httpgw.LoadPassed(specs, f); err != nil {
		e.errorf("%v", err)
		return ExitNoInput
	}
	return 0
}

// runDetached is run --detach.
func (e *Env) runDetached(id string, argv []string, rf runFlags, specs []*httpgw.Spec) int {
	root, code := e.openRoot(true)
	if root == nil {
		return code
	}
	defer root.Close()
	// The same ID again is answered here, as plain run answers it, without
	// starting anything. (A claim racing this one is answered by the
	// supervisor, whose message is relayed below.)
	if d, err := root.Open(id); err == nil || !errors.Is(err, rundir.ErrNoRun) {
		if d != nil {
			d.Close()
		}
		return e.existingRun(root, id)
	}

	exe, err := os.Executable()
	if err != nil {
		e.errorf("run %s: --detach: cannot find this program to start the supervisor: %v", id, err)
		return ExitCannot
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		e.errorf("run %s: --detach: %v", id, err)
		return ExitCannot
	}
	defer devnull.Close()
	repR, repW, err := os.Pipe()
	if err != nil {
		e.errorf("run %s: --detach: %v", id, err)
		return ExitCannot
	}
	defer repR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		repW.Close()
		e.errorf("run %s: --detach: %v", id, err)
		return ExitCannot
	}
	defer errR.Close()

	args := []string{os.Args[0], "--root", root.Path, "run", "--no-stream",
		"--lease", time.Duration(rf.lease).String(), "--grace", time.Duration(rf.grace).String(),
		"--on-hangup", rf.onHangup, "--cgroup", rf.cgroup, "--agent", rf.agent, "--detach-fd", fmt.Sprint(detachFD)}
	if rf.stdin == stdinPipe {
		args = append(args, "--stdin", stdinPipe) // else inherit: the supervisor's is /dev/null
	}
	if rf.handoffGrace >= 0 {
		args = append(args, "--handoff-grace", time.Duration(rf.handoffGrace).String())
	}
	args = append(args, rf.http.Args()...)
	var secR, secW *os.File
	if len(specs) > 0 {
		// The gateways' secrets and CAs, read here, go to the supervisor on
		// a pipe (fd 4), never in its argv or environment; it is started
		// with the same --http* flags, and reads no file or variable again.
		if secR, secW, err = os.Pipe(); err != nil {
			repW.Close()
			errW.Close()
			e.errorf("run %s: --detach: %v", id, err)
			return ExitCannot
		}
		args = append(args, "--http-fd", fmt.Sprint(httpFD))
	}
	args = append(args, id, "--")
	cmd := &exec.Cmd{
		Path:       exe,
		Args:       append(args, argv...),
		Env:        oneProcessor(withoutVars(os.Environ(), httpgw.EnvVars(specs))),
		Stdin:      devnull,
		Stdout:     devnull,
		Stderr:     errW,
		ExtraFiles: []*os.File{repW}, // fd 3 == detachFD
		// A session of its own: no terminal, no signal meant for the
		// caller's group or session reaches it.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if secR != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, secR) // fd 4 == httpFD
	}
	err = cmd.Start()
	repW.Close()
	errW.Close()
	if secR != nil {
		secR.Close()
		go func() {
			_, _ = secW.Write(httpgw.Passed(specs)) // EPIPE: it ended first, and says why
			secW.Close()
		}()
	}
	if err != nil {
		e.errorf("run %s: --detach: cannot start the supervisor: %v", id, err)
		return ExitCannot
	}
	relayed := make(chan struct{})
	go func() {
		io.Copy(e.Stderr, errR)
		close(relayed)
	}()
	report, _ := io.ReadAll(repR)
	if len(report) > 0 {
		rec, err := statusfile.Parse(report)
		if err == nil {
			// The supervisor pointed its stderr at /dev/null before it
			// wrote the report, so the relay ends at once; the timer only
			// guards against a supervisor that could not.
			select {
			case <-relayed:
			case <-time.After(2 * time.Second):
			}
			_ = cmd.Process.Release()
			b, _ := statusfile.Marshal(rec)
			e.Stdout.Write(b)
			return ExitOK
		}
		// Something was reported, so the supervisor reached `running`: do
		// not wait for the whole run to say that the report was garbled.
		_ = cmd.Process.Release()
		e.errorf("run %s: --detach: the supervisor reported something that is not a record: %v", id, err)
		e.hint("see what happened with 'agent-wrap reconcile %s'", id)
		return ExitSoftware
	}
	// No record: the supervisor ended before the run was running. Its own
	// messages have been relayed; its exit code is the answer.
	werr := cmd.Wait()
	<-relayed
	st, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case st.Signaled():
		e.errorf("run %s: --detach: the supervisor was killed by SIG%s before the run was running", id, proc.SignalName(st.Signal()))
		e.hint("see what happened with 'agent-wrap reconcile %s'", id)
		return 128 + int(st.Signal())
	case werr == nil:
		// Exit 0 without a record cannot come from a run that was started;
		// say so rather than claim success.
		e.errorf("run %s: --detach: the supervisor exited without reporting a running record", id)
		e.hint("see what happened with 'agent-wrap reconcile %s'", id)
		return ExitSoftware
	}
	return st.ExitStatus()
}

// detachedRunning is the supervisor's Running callback under --detach-fd:
// from now on it has no caller, so its stderr goes to /dev/null (which also
// ends the caller's relay), then the record goes to fd and fd is closed.
func detachedRunning(fd int) func(*statusfile.Record) {
	return func(rec *statusfile.Record) {
		if null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
			_ = unix.Dup3(int(null.Fd()), 2, 0)
			null.Close()
		}
		f := os.NewFile(uintptr(fd), "detach-report")
		if f == nil {
			return
		}
		if b, err := statusfile.Marshal(rec); err == nil {
			_, _ = f.Write(b) // EPIPE: the caller is gone; the run goes on
		}
		f.Close()
	}
}
