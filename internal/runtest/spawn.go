package runtest

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

// Spawn starts argv as a child of the test with attr (nil: in a session of
// its own; without Setsid or Setpgid, in a group of its own) and returns
// its stat, read right after the fork. When the test ends its process
// group is KILLed and waited for, and the test fails if any of it
// survives (StartInGroup).
func Spawn(t testing.TB, attr *unix.SysProcAttr, argv ...string) proc.Stat {
	t.Helper()
	if attr == nil {
		attr = &unix.SysProcAttr{Setsid: true}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = attr
	return StartInGroup(t, cmd).Leader
}

// Cgroup creates a run cgroup named name, as a wrapper would, and when the
// test ends kills what is in it and removes it. Where the host delegates no
// writable cgroup v2 subtree the test is skipped, and fails under CI=true.
func Cgroup(t testing.TB, name string) *cgroup.Group {
	t.Helper()
	g, err := cgroup.Create(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI machines have a writable cgroup v2 tree, but: %v", err)
		}
		t.Skipf("no writable cgroup v2 subtree here: %v", err)
	}
	t.Cleanup(func() { g.Close(); stop.KillCgroup(g.Path); cgroup.Remove(g.Path) })
	return g
}

// SpawnIn is Spawn into cgroup g (clone3 CLONE_INTO_CGROUP), in a session
// of its own, as a wrapper starts a job.
func SpawnIn(t testing.TB, g *cgroup.Group, argv ...string) proc.Stat {
	t.Helper()
	return Spawn(t, &unix.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: g.FD()}, argv...)
}
