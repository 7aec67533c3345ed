package transport

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// TestOrphanGuard runs the macOS orphan guard here, for real: a child
// process plays the controller (this test binary again, role set by
// AGENT_WRAP_GUARD_CHILD), starts the guard with each shell the guard may
// meet (/bin/sh, and bash, which is macOS's /bin/sh), registers two
// process groups, unregisters one, and is SIGKILLed. The registered group
// must die with it; the unregistered one must not.
func TestOrphanGuard(t *testing.T) {
	if out := os.Getenv("AGENT_WRAP_GUARD_CHILD"); out != "" {
		guardChildRole(t, out, os.Getenv("AGENT_WRAP_GUARD_SHELL"))
		return
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash not found: the guard must be tried with it (macOS's /bin/sh is bash)")
	}
	for _, sh := range []string{"/bin/sh", bash} {
		t.Run(filepath.Base(sh), func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "pids")
			cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanGuard$", "-test.count=1")
			cmd.Env = append(os.Environ(), "AGENT_WRAP_GUARD_CHILD="+out, "AGENT_WRAP_GUARD_SHELL="+sh)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var guarded, released, leak int
			deadline := time.Now().Add(30 * time.Second)
			for guarded == 0 {
				if b, err := os.ReadFile(out); err == nil && strings.HasSuffix(string(b), "\n") {
					fmt.Sscanf(string(b), "%d %d %d", &guarded, &released, &leak)
				}
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatal("the child controller never registered its groups")
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Cleanup(func() {
				syscall.Kill(-guarded, syscall.SIGKILL)
				syscall.Kill(-released, syscall.SIGKILL)
				syscall.Kill(leak, syscall.SIGKILL)
			})
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			for proc.Alive(guarded, 0) {
				if time.Now().After(deadline) {
					t.Fatalf("group %d outlived its controller by 30s: the guard did not kill it", guarded)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !proc.Alive(released, 0) {
				t.Errorf("group %d, unregistered before the controller died, was killed", released)
			}
		})
	}
}

// guardChildRole is the controller's side: the guard, a registered group
// and a released one (each a sleep leading its own group, as ssh clients
// are), their PIDs written to out, then it waits to be killed. A third
// child, started after the guard, would hold the pipe open if its writing
// end leaked into children.
func guardChildRole(t *testing.T, out, sh string) {
	g := &guard{sh: sh}
	start := func() int {
		c := exec.Command("sleep", "300")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		go c.Wait()
		return c.Process.Pid
	}
	a, b := start(), start()
	if err := g.add(a); err != nil {
		t.Fatal(err)
	}
	if err := g.add(b); err != nil {
		t.Fatal(err)
	}
	g.remove(b)
	leak := exec.Command("sleep", "300")
	if err := leak.Start(); err != nil {
		t.Fatal(err)
	}
	go leak.Wait()
	pids := strconv.Itoa(a) + " " + strconv.Itoa(b) + " " + strconv.Itoa(leak.Process.Pid) + "\n"
	if err := os.WriteFile(out, []byte(pids), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Minute)
}
