package runtest

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// Group is a process a test started as the leader of a process group of its
// own (or of a session of its own), with what it takes to kill the whole
// group later by identity: the leader's PID and start time, read right
// after the fork. A test signals the group without signalling itself, and
// stops it at the end whatever the test did to it.
type Group struct {
	Cmd    *exec.Cmd
	Leader proc.Stat // the leader as it was right after the fork; Leader.PGID is the group
	done   chan struct{}
	err    error // Cmd.Wait's, once done is closed
}

// StartGroup starts cmd as the leader of a process group of its own: with
// Setpgid, unless cmd.SysProcAttr already asks for Setsid or Setpgid (a
// session of its own is a group of its own too). It reads the leader's
// stat before anything can reap it, so the group is known by identity even
// if the leader exits at once.
func StartGroup(cmd *exec.Cmd) (*Group, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &unix.SysProcAttr{}
	}
	if !cmd.SysProcAttr.Setsid && !cmd.SysProcAttr.Setpgid {
		cmd.SysProcAttr.Setpgid = true
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &Group{Cmd: cmd, done: make(chan struct{})}
	// Before Wait: until it is reaped, the leader's /proc entry stays,
	// a zombie's included.
	st, err := proc.ReadStat(cmd.Process.Pid)
	go func() { g.err = cmd.Wait(); close(g.done) }()
	if err != nil {
		_ = cmd.Process.Kill()
		<-g.done
		return nil, fmt.Errorf("reading the stat of %v (pid %d) right after its start: %v", cmd.Args, cmd.Process.Pid, err)
	}
	g.Leader = st
	return g, nil
}

// StartInGroup is StartGroup for a test: it fails the test if cmd cannot
// start, and when the test ends it stops the group and fails the test,
// naming each one, if any member outlives the KILL.
func StartInGroup(t testing.TB, cmd *exec.Cmd) *Group {
	t.Helper()
	g, err := StartGroup(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// PGID is the group's ID: the leader's PID.
func (g *Group) PGID() int { return g.Leader.PGID }

// Done is closed once the leader has exited and been reaped; Err is then
// what exec's Wait returned.
func (g *Group) Done() <-chan struct{} { return g.done }

// Err is exec's Wait's error once Done is closed (nil before).
func (g *Group) Err() error {
	select {
	case <-g.done:
		return g.err
	default:
		return nil
	}
}

// Exited reports whether the leader has exited and been reaped.
func (g *Group) Exited() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// Members lists the live members of the group (a zombie counts as dead),
// and none of a group that took its number since (GroupOf).
func (g *Group) Members() []proc.Stat { return GroupOf(g.Leader.PGID, g.Leader.Start) }

// Signal sends sig to each live member of the group, each checked against
// its start time as it is signalled: never a bare kill(-pgid), whose number
// can be another's once the group is gone.
func (g *Group) Signal(sig unix.Signal) {
	SignalGroup(g.Leader.PGID, g.Leader.Start, sig)
}

// Stop KILLs every member of the group and the leader, waits (Patience) for
// the leader to be reaped and the group to be empty, and returns an error
// naming every member that still runs.
func (g *Group) Stop() error {
	g.Signal(unix.SIGKILL)
	if !g.Exited() {
		_ = g.Cmd.Process.Kill()
	}
	<-g.done
	return g.gone(Patience)
}

// gone waits up to d for the group to be empty (Stop has KILLed it) and
// returns an error naming every member that still runs then.
func (g *Group) gone(d time.Duration) error {
	if Within(d, func() bool { return len(g.Members()) == 0 }) {
		return nil
	}
	var bad []string
	for _, p := range g.Members() {
		argv, _ := proc.Cmdline(p.PID)
		bad = append(bad, fmt.Sprintf("pid %d (%s) state %c", p.PID, strings.Join(argv, " "), p.State))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("process group %d of %v: still running %v after its KILL:\n  %s", g.Leader.PGID, g.Cmd.Args, d, strings.Join(bad, "\n  "))
}
