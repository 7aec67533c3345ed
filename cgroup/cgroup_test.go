package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/proc"
)

// Mount's statfs of the well-known places finds the mount that the mount
// table names, where the host has cgroup2 at all.
func TestMountAgreesWithMountinfo(t *testing.T) {
	want, err := readMount()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no cgroup2 mount on this host: %v", err)
		}
		t.Skipf("no cgroup2 mount on this host: %v", err)
	}
	mounted.Store(nil)
	got, err := Mount()
	if err != nil || got != want {
		t.Fatalf("Mount() = %q, %v; /proc/self/mountinfo names %q", got, err, want)
	}
	if again, _ := Mount(); again != got {
		t.Fatalf("second Mount() = %q, want %q", again, got)
	}
}

// testGroup creates the cgroup NAME.PID for a test, closed and removed at
// cleanup; where no cgroup can be made the test is skipped (failed in CI).
func testGroup(t *testing.T, name string) *Group {
	t.Helper()
	g, err := Create(fmt.Sprintf("%s.%d", name, os.Getpid()))
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot create a cgroup here: %v", err)
		}
		t.Skipf("cannot create a cgroup here: %v", err)
	}
	t.Cleanup(func() {
		Remove(g.Path)
		g.Close()
	})
	return g
}

// sleepIn starts `sleep 300` into g (CLONE_INTO_CGROUP, as the wrapper
// starts a job); the caller kills and reaps it.
func sleepIn(t *testing.T, g *Group) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "300")
	c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: g.FD()}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Procs lists the processes started into a run's cgroup (CLONE_INTO_CGROUP,
// as the wrapper starts a job), none once they are dead, and nothing,
// without an error, for a cgroup that is gone.
func TestProcsListsMembers(t *testing.T) {
	g := testGroup(t, "procs-test")
	var want []int
	var cmds []*exec.Cmd
	for i := 0; i < 3; i++ {
		c := sleepIn(t, g)
		cmds = append(cmds, c)
		want = append(want, c.Process.Pid)
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill() // by pidfd, to our own unreaped child
			c.Wait()
		}
	}()
	got, err := Procs(g.Path)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(want) // PIDs wrap
	if !slices.Equal(got, want) {
		t.Fatalf("Procs = %v, want %v", got, want)
	}
	for _, c := range cmds {
		c.Process.Kill()
		c.Wait()
	}
	if got, err := Procs(g.Path); err != nil || len(got) != 0 {
		t.Fatalf("after the members were reaped: Procs = %v, %v; want none", got, err)
	}
	if err := Remove(g.Path); err != nil {
		t.Fatal(err)
	}
	if got, err := Procs(g.Path); err != nil || got != nil {
		t.Fatalf("a removed cgroup: Procs = %v, %v; want nil, nil", got, err)
	}
}

// Populated says 1 while a live process is in the cgroup, 0 once it has
// exited even while its zombie is not reaped yet, and 0 for a cgroup that
// is gone.
func TestPopulated(t *testing.T) {
	g := testGroup(t, "populated-test")
	if p, err := Populated(g.Path); err != nil || p {
		t.Fatalf("a new cgroup: Populated = %v, %v; want false", p, err)
	}
	c := sleepIn(t, g)
	defer func() { c.Process.Kill(); c.Wait() }()
	if p, err := Populated(g.Path); err != nil || !p {
		t.Fatalf("with a live member: Populated = %v, %v; want true", p, err)
	}
	// Killed but not reaped: a zombie, which holds its PID, not the cgroup.
	if err := c.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		st, err := proc.ReadStat(c.Process.Pid)
		if err == nil && st.State == 'Z' {
			break
		}
		if i > 30000 {
			t.Fatalf("the killed member never became a zombie: %+v, %v", st, err)
		}
		syscall.Nanosleep(&syscall.Timespec{Nsec: 1e6}, nil)
	}
	if p, err := Populated(g.Path); err != nil || p {
		t.Fatalf("with only a zombie: Populated = %v, %v; want false", p, err)
	}
	c.Wait()
	if err := Remove(g.Path); err != nil {
		t.Fatal(err)
	}
	if p, err := Populated(g.Path); err != nil || p {
		t.Fatalf("a removed cgroup: Populated = %v, %v; want false, nil", p, err)
	}
}
