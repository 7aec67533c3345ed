//go:build linux

package cli_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// scriptParams is the shared testscript setup: every script gets a private
// run root in $AGENT_WRAP_ROOT and the custom commands below (CONTRIBUTING.md
// says the same for a reader of the scripts). When a
// script ends, whatever its runs left is killed by recorded group and
// PIDs (never by name), and so is every group it started.
//
// Commands for exit codes and process trees (every wait is bounded by
// runtest.Patience, generous for a loaded machine; none is a fixed sleep;
// a zombie counts as dead):
//
//	exits CODE PROG [ARG...]
//	    run PROG like exec; fail unless it exits with exactly CODE.
//	startgroup NAME [VAR=VALUE...] PROG [ARG...]
//	    start PROG in the background as the leader of a process group of
//	    its own, named NAME, its output kept for waitgroup. Its environment
//	    is the one the script started with, as the script has changed it
//	    since, plus each VAR=VALUE (a variable the script added with env
//	    is passed only that way). When the script ends the
//	    group is KILLed, and the script fails, naming them, if any member
//	    outlives that.
//	waitgroup NAME [CODE]
//	    wait for NAME's leader to exit; its stdout and stderr become this
//	    command's, for stdout and stderr to match. With CODE, fail unless
//	    it exited with exactly CODE (128+N if signal N killed it, as a
//	    shell says).
//	rungroup NAME RUN_ID
//	    wait until run RUN_ID's record (under $AGENT_WRAP_ROOT) names its
//	    process group, and name that group NAME: for killgroup,
//	    members and groupgone, which then also count the run's recorded
//	    escaped descendants.
//	killgroup [-SIG] NAME
//	    send SIG (default TERM; a name like KILL or HUP) to every live
//	    member of group NAME, each checked against its start time: never a
//	    bare kill(-pgid), whose number may be another's by then.
//	members NAME N
//	    wait until group NAME has exactly N live members.
//	groupgone NAME
//	    wait until nothing of group NAME runs; fail naming every survivor.
//	    '! groupgone NAME' fails unless something of it runs now.
//	waitfile PATH [PATTERN]
//	    wait until PATH exists (and, with PATTERN, its content matches the
//	    regular expression).
//	escapes RUN_ID N
//	    wait until run RUN_ID's record lists at least N escaped
//	    descendants that still run and its journal has an escaped line for
//	    each; fail if one of them is in the run's own group. Prints them,
//	    one "PID ARGV" line each, for stdout to match, and sets
//	    $ESCAPED_1, $ESCAPED_2, ... to their PIDs.
//	leasepassed RUN_ID
//	    wait until the deadline in run RUN_ID's deadline_epoch has passed.
func scriptParams() testscript.Params {
	return testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			root := env.WorkDir + "/runs"
			env.Setenv("AGENT_WRAP_ROOT", root)
			st := &scriptState{env: env, t: env.T(), groups: map[string]*scriptGroup{}}
			env.Values[scriptStateKey{}] = st
			env.Defer(func() { runtest.KillRuns(root) })
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exits":       cmdExits,
			"startgroup":  cmdStartGroup,
			"waitgroup":   cmdWaitGroup,
			"rungroup":    cmdRunGroup,
			"killgroup":   cmdKillGroup,
			"members":     cmdMembers,
			"groupgone":   cmdGroupGone,
			"waitfile":    cmdWaitFile,
			"escapes":     cmdEscapes,
			"leasepassed": cmdLeasePassed,
		},
	}
}

// exits N PROG [ARG...] runs PROG like exec and fails unless it exits with
// exactly N; testscript's own exec only tells zero from non-zero, and
// agent-wrap's exit codes are part of its contract.
func cmdExits(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exits CODE PROG [ARG...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exits: bad code %q", args[0])
	}
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		got = ee.ExitCode()
	case err != nil:
		ts.Fatalf("exits: %v", err)
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}

type scriptStateKey struct{}

// scriptState is one script's named groups.
type scriptState struct {
	env    *testscript.Env
	t      testscript.T
	groups map[string]*scriptGroup
}

// A scriptGroup is a group a script started (g) or a run's recorded group
// (run).
type scriptGroup struct {
	g              *runtest.Group
	stdout, stderr runtest.Buffer
	run            *runtest.Run
}

func stateOf(ts *testscript.TestScript) *scriptState {
	return ts.Value(scriptStateKey{}).(*scriptState)
}

func (st *scriptState) group(ts *testscript.TestScript, name string) *scriptGroup {
	sg := st.groups[name]
	if sg == nil {
		ts.Fatalf("no group named %q: start one with startgroup or name a run's with rungroup", name)
	}
	return sg
}

func (st *scriptState) add(ts *testscript.TestScript, name string, sg *scriptGroup) {
	if st.groups[name] != nil {
		ts.Fatalf("group %q is named already", name)
	}
	st.groups[name] = sg
}

// fail fails the script from a deferred cleanup, where ts.Fatalf cannot.
func (st *scriptState) fail(err error) {
	if t, ok := st.t.(interface{ Errorf(string, ...any) }); ok {
		t.Errorf("%v", err)
		return
	}
	st.t.Log(err)
	st.t.FailNow()
}

// survivors describes each live member of the group, one line each.
func (sg *scriptGroup) survivors() []string {
	if sg.run != nil {
		return sg.run.Survivors()
	}
	var bad []string
	for _, p := range sg.g.Members() {
		argv, _ := proc.Cmdline(p.PID)
		bad = append(bad, fmt.Sprintf("pid %d (%s) state %c in group %d", p.PID, strings.Join(argv, " "), p.State, p.PGID))
	}
	return bad
}

func (sg *scriptGroup) members() int {
	if sg.run != nil {
		return len(sg.run.Survivors())
	}
	return len(sg.g.Members())
}

func cmdStartGroup(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: startgroup NAME [VAR=VALUE...] PROG [ARG...]")
	}
	st := stateOf(ts)
	name, args := args[0], args[1:]
	// The script's environment as it is now: the variables Setup made,
	// with the values the script gave them since.
	var env []string
	for _, kv := range st.env.Vars {
		k, _, _ := strings.Cut(kv, "=")
		env = append(env, k+"="+ts.Getenv(k))
	}
	for len(args) > 0 && strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "=") {
		env = append(env, args[0])
		args = args[1:]
	}
	if len(args) == 0 {
		ts.Fatalf("startgroup %s: no program", name)
	}
	path := args[0]
	if !strings.Contains(path, "/") {
		path = lookPath(ts, path)
	}
	sg := &scriptGroup{}
	cmd := exec.Command(path, args[1:]...)
	cmd.Env, cmd.Dir = env, ts.MkAbs(".")
	cmd.Stdout, cmd.Stderr = &sg.stdout, &sg.stderr
	g, err := runtest.StartGroup(cmd)
	if err != nil {
		ts.Fatalf("startgroup %s: %v", name, err)
	}
	sg.g = g
	st.add(ts, name, sg)
	ts.Defer(func() {
		if err := g.Stop(); err != nil {
			st.fail(fmt.Errorf("startgroup %s: %v", name, err))
		}
	})
	ts.Logf("startgroup %s: pid %d, group %d", name, g.Leader.PID, g.PGID())
}

// lookPath finds prog in the script's $PATH (where testscript puts the
// agent-wrap command).
func lookPath(ts *testscript.TestScript, prog string) string {
	for _, dir := range filepath.SplitList(ts.Getenv("PATH")) {
		p := filepath.Join(dir, prog)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	ts.Fatalf("%s: not found in the script's $PATH", prog)
	return ""
}

func cmdWaitGroup(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waitgroup NAME [CODE]")
	}
	sg := stateOf(ts).group(ts, args[0])
	if sg.g == nil {
		ts.Fatalf("waitgroup %s: a run's group has no leader of the script's to wait for", args[0])
	}
	select {
	case <-sg.g.Done():
	case <-time.After(runtest.Patience):
		ts.Fatalf("waitgroup %s: %v still runs after %v\nstderr so far: %s", args[0], sg.g.Cmd.Args, runtest.Patience, sg.stderr.String())
	}
	ts.Stdout().Write(sg.stdout.Bytes())
	ts.Stderr().Write(sg.stderr.Bytes())
	got := sg.g.Cmd.ProcessState.ExitCode()
	if ws, ok := sg.g.Cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		got = 128 + int(ws.Signal())
	}
	if len(args) == 2 {
		want, err := strconv.Atoi(args[1])
		if err != nil {
			ts.Fatalf("waitgroup: bad code %q", args[1])
		}
		if got != want {
			ts.Fatalf("%s exited %d (%v), want %d", args[0], got, sg.g.Cmd.ProcessState, want)
		}
	}
}

func cmdRunGroup(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: rungroup NAME RUN_ID")
	}
	r := &runtest.Run{Root: ts.Getenv("AGENT_WRAP_ROOT"), ID: args[1]}
	ok := runtest.Within(runtest.Patience, func() bool {
		rec := r.Status()
		return rec != nil && rec.PGID > 1 && rec.LeaderStart != 0 && r.PGID() == rec.PGID
	})
	if !ok {
		ts.Fatalf("rungroup: run %s recorded no process group within %v\nstatus.json: %s", r.ID, runtest.Patience, r.File("status.json"))
	}
	stateOf(ts).add(ts, args[0], &scriptGroup{run: r})
	ts.Logf("rungroup %s: run %s, group %d", args[0], r.ID, r.PGID())
}

func cmdKillGroup(ts *testscript.TestScript, neg bool, args []string) {
	sig := unix.SIGTERM
	if len(args) == 2 && strings.HasPrefix(args[0], "-") {
		sig = unix.SignalNum("SIG" + strings.TrimPrefix(args[0], "-"))
		if sig == 0 {
			ts.Fatalf("killgroup: no signal %q", args[0])
		}
		args = args[1:]
	}
	if neg || len(args) != 1 {
		ts.Fatalf("usage: killgroup [-SIG] NAME")
	}
	sg := stateOf(ts).group(ts, args[0])
	if sg.g != nil {
		sg.g.Signal(sig)
		return
	}
	rec := sg.run.Status()
	if rec == nil {
		ts.Fatalf("killgroup %s: run %s has no readable record", args[0], sg.run.ID)
	}
	runtest.SignalGroup(rec.PGID, rec.LeaderStart, sig)
}

func cmdMembers(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: members NAME N")
	}
	sg := stateOf(ts).group(ts, args[0])
	want, err := strconv.Atoi(args[1])
	if err != nil {
		ts.Fatalf("members: bad count %q", args[1])
	}
	if !runtest.Within(runtest.Patience, func() bool { return sg.members() == want }) {
		ts.Fatalf("group %s: %d live members after %v, want %d:\n  %s", args[0], sg.members(), runtest.Patience, want, strings.Join(sg.survivors(), "\n  "))
	}
}

func cmdGroupGone(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: [!] groupgone NAME")
	}
	sg := stateOf(ts).group(ts, args[0])
	if neg {
		if len(sg.survivors()) == 0 {
			ts.Fatalf("group %s: nothing of it runs", args[0])
		}
		return
	}
	if !runtest.Within(runtest.Patience, func() bool { return len(sg.survivors()) == 0 }) {
		ts.Fatalf("group %s: processes survived (%v after asking):\n  %s", args[0], runtest.Patience, strings.Join(sg.survivors(), "\n  "))
	}
}

func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waitfile PATH [PATTERN]")
	}
	path := ts.MkAbs(args[0])
	var re *regexp.Regexp
	if len(args) == 2 {
		var err error
		if re, err = regexp.Compile(args[1]); err != nil {
			ts.Fatalf("waitfile: %v", err)
		}
	}
	ok := runtest.Within(runtest.Patience, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && (re == nil || re.Match(b))
	})
	if !ok {
		b, err := os.ReadFile(path)
		ts.Fatalf("waitfile: %s did not come to match %q within %v (now: %q, %v)", args[0], args[len(args)-1], runtest.Patience, b, err)
	}
}

func cmdEscapes(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: escapes RUN_ID N")
	}
	r := runtest.Run{Root: ts.Getenv("AGENT_WRAP_ROOT"), ID: args[0]}
	want, err := strconv.Atoi(args[1])
	if err != nil {
		ts.Fatalf("escapes: bad count %q", args[1])
	}
	var lines, pids []string
	ok := runtest.Within(runtest.Patience, func() bool {
		rec := r.Status()
		if rec == nil {
			return false
		}
		lines, pids = lines[:0], pids[:0]
		for _, e := range rec.Escaped {
			if proc.Alive(e.PID, e.Start) {
				if e.SID == r.PGID() && e.PGID == r.PGID() {
					ts.Fatalf("run %s: recorded escape %d is in the run's own group", r.ID, e.PID)
				}
				lines = append(lines, fmt.Sprintf("%d %s", e.PID, strings.Join(e.Argv, " ")))
				pids = append(pids, strconv.Itoa(e.PID))
			}
		}
		return len(lines) >= want && strings.Count(r.File(rundir.EventsFile), `"event":"escaped"`) >= want
	})
	if !ok {
		ts.Fatalf("run %s: gave up after %v waiting for %d live escaped descendants recorded and journaled\nstatus: %s\njournal: %s", r.ID, runtest.Patience, want, r.File("status.json"), r.File(rundir.EventsFile))
	}
	for i, pid := range pids {
		ts.Setenv(fmt.Sprintf("ESCAPED_%d", i+1), pid)
	}
	fmt.Fprintln(ts.Stdout(), strings.Join(lines, "\n"))
}

func cmdLeasePassed(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: leasepassed RUN_ID")
	}
	r := runtest.Run{Root: ts.Getenv("AGENT_WRAP_ROOT"), ID: args[0]}
	dl, err := strconv.ParseInt(strings.TrimSpace(r.File(rundir.DeadlineFile)), 10, 64)
	if err != nil {
		ts.Fatalf("leasepassed: run %s: %s: %v", r.ID, rundir.DeadlineFile, err)
	}
	if !runtest.Within(runtest.Patience, func() bool { return time.Now().After(time.Unix(dl, 0)) }) {
		ts.Fatalf("leasepassed: run %s's deadline %v has not passed within %v", r.ID, time.Unix(dl, 0), runtest.Patience)
	}
}
