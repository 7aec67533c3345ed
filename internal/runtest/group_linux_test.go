package runtest

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// A group started by StartGroup is its leader's, signalled by identity,
// and Stop leaves none of it: not the leader, not a child in the group.
func TestGroupStopLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		attr *unix.SysProcAttr
	}{{"setpgid", nil}, {"setsid", &unix.SysProcAttr{Setsid: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", "sleep 300 & sleep 300 & wait")
			cmd.SysProcAttr = tc.attr
			g, err := StartGroup(cmd)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Stop() })
			if g.PGID() != g.Cmd.Process.Pid || g.Leader.PGID != g.Leader.PID {
				t.Fatalf("leader %+v does not lead its group", g.Leader)
			}
			if me, _ := proc.ReadStat(unix.Getpid()); me.PGID == g.PGID() {
				t.Fatal("the group is the test's own")
			}
			Eventually(t, "three members", func() bool { return len(g.Members()) == 3 })
			members := g.Members()
			if err := g.Stop(); err != nil {
				t.Fatal(err)
			}
			if !g.Exited() || g.Err() == nil {
				t.Fatalf("after Stop the leader is reaped with an error (killed): exited %v, err %v", g.Exited(), g.Err())
			}
			for _, p := range members {
				if proc.Alive(p.PID, p.Start) {
					t.Fatalf("pid %d survived Stop", p.PID)
				}
			}
		})
	}
}

// Signal reaches every member; a leader that dies of it is reaped.
func TestGroupSignal(t *testing.T) {
	g := StartInGroup(t, exec.Command("sh", "-c", "sleep 300 & wait"))
	Eventually(t, "two members", func() bool { return len(g.Members()) == 2 })
	g.Signal(unix.SIGTERM)
	Eventually(t, "the group to be empty", func() bool { return len(g.Members()) == 0 })
	Eventually(t, "the leader to be reaped", g.Exited)
}

// What Stop says when a member survives: each one named, with its command
// line. (Nothing outlives SIGKILL to be caught in the act, so the check is
// asked of a group not yet stopped.)
func TestGroupSurvivorsNamed(t *testing.T) {
	g := StartInGroup(t, exec.Command("sh", "-c", "sleep 301 & wait"))
	Eventually(t, "two members", func() bool { return len(g.Members()) == 2 })
	err := g.gone(0)
	if err == nil {
		t.Fatal("a live group is gone")
	}
	for _, want := range []string{"sleep 301", fmt.Sprintf("pid %d (sh -c sleep 301 & wait)", g.Leader.PID)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %q", err, want)
		}
	}
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
}
