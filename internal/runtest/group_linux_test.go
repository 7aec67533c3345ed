package runtest

import (
	"os/exec"
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
				if AliveAs(p.PID, p.Start) {
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
