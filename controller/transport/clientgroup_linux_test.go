package transport

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// startClient starts `sh -c script sh args...` as a client is started (its
// own process group: clientAttr), its stdout a pipe, and returns it with its
// leader's stat. Whatever is left of its group is killed by identity when
// the test ends.
func startClient(t *testing.T, waitDelay time.Duration, script string, args ...string) (*exec.Cmd, proc.Stat, *runtest.Buffer) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", script, "sh"}, args...)...)
	var out runtest.Buffer
	cmd.Stdout = &out // not an *os.File: exec copies from a pipe, as for ssh
	cmd.WaitDelay = waitDelay
	return cmd, startLeader(t, cmd), &out
}

// memberFrom waits for a group member to write its PID to file and
// returns its stat.
func memberFrom(t *testing.T, file string) proc.Stat {
	t.Helper()
	var member proc.Stat
	runtest.Eventually(t, "the member to say its PID", func() bool {
		b, _ := os.ReadFile(file)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return false
		}
		member, err = proc.ReadStat(pid)
		return err == nil
	})
	return member
}

// killedAtCancel waits on g with a context cancelled at once, checks that
// the client died of SIGKILL, and returns whether the kill signalled its
// group (not the client alone).
func killedAtCancel(t *testing.T, g *clientGroup) (sentToGroup bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan bool, 1)
	g.onKill = func(s bool) { sent <- s }
	done := make(chan error, 1)
	go func() { done <- g.wait(ctx) }()
	cancel()
	err := waitErr(t, done)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Fatalf("wait = %v, want the client killed (exit code -1)", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the client ended with %v, want SIGKILL", ee.Sys())
	}
	return <-sent
}

// startLeader starts cmd as a client is started (clientAttr: the leader of
// a process group of its own) and returns its stat; cleanup kills what is
// left of its group, by the leader's identity.
func startLeader(t *testing.T, cmd *exec.Cmd) proc.Stat {
	t.Helper()
	cmd.SysProcAttr = clientAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := proc.ReadStat(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	t.Cleanup(func() { runtest.KillGroup(st.PID, st.Start) })
	return st
}

// reaped reports whether pid is gone from /proc: no longer even a zombie.
func reaped(pid int) bool {
	_, err := proc.ReadStat(pid)
	return errors.Is(err, proc.ErrGone)
}

// waitErr waits (with runtest.Patience) for the result of a wait.
func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(runtest.Patience):
		t.Fatalf("the client's wait did not return within %v", runtest.Patience)
		return nil
	}
}

// TestClientGroupKilledWhileClientRuns: a context that ends while the
// client runs kills its whole group, the client and a member (as ssh and
// its ProxyCommand), read from the real /proc.
func TestClientGroupKilledWhileClientRuns(t *testing.T) {
	t.Parallel()
	memberF := filepath.Join(t.TempDir(), "member")
	cmd, leader, _ := startClient(t, runtest.Patience, `sleep 600 & echo $! > "$1"; wait`, memberF)
	member := memberFrom(t, memberF)
	if member.PGID != leader.PID {
		t.Fatalf("member %d is in group %d, not the client's %d", member.PID, member.PGID, leader.PID)
	}

	if s := killedAtCancel(t, newClientGroup(cmd)); !s {
		t.Fatal("the kill did not signal the group of a client that was running")
	}
	runtest.Eventually(t, "the client's group to be empty", func() bool {
		return len(runtest.GroupOf(leader.PID, leader.Start)) == 0
	})
	if proc.Alive(member.PID, member.Start) {
		t.Fatalf("member %d survived", member.PID)
	}
}

// TestClientGroupKillsSSHAndProxyCommand: the same against a real ssh
// client logged in to a real sshd through a ProxyCommand (bash relaying
// the TCP connection with two cats): a context that ends while the session
// is open leaves nothing of the group alive, ssh nor any process of its
// ProxyCommand.
func TestClientGroupKillsSSHAndProxyCommand(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	args := append(srv.SSHArgs(),
		"-o", `ProxyCommand=bash -c 'exec 3<>/dev/tcp/%h/%p; cat <&3 & exec cat >&3'`,
		"--", srv.Destination(), "echo up; read x")
	cmd := exec.Command("ssh", args...)
	var out, errb runtest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	stdin, err := cmd.StdinPipe() // open until the test ends: the remote read waits
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	leader := startLeader(t, cmd)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- waitClient(ctx, cmd) }()

	runtest.Eventually(t, "the session to be open", func() bool { return out.String() == "up\n" })
	members := runtest.GroupOf(leader.PID, leader.Start)
	proxy := 0
	for _, m := range members {
		if argv, _ := proc.Cmdline(m.PID); len(argv) > 0 && argv[0] == "cat" {
			proxy++
		}
	}
	if proxy != 2 {
		t.Fatalf("group %d has %d processes of the ProxyCommand (want its 2 cats): %v\nssh: %s", leader.PID, proxy, members, errb.String())
	}

	cancel()
	err = waitErr(t, done)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Fatalf("wait = %v, want ssh killed (exit code -1)\nssh: %s", err, errb.String())
	}
	runtest.Eventually(t, "the client's group to be empty", func() bool {
		return len(runtest.GroupOf(leader.PID, leader.Start)) == 0
	})
	for _, m := range members {
		if proc.Alive(m.PID, m.Start) {
			t.Fatalf("pid %d of the group survived", m.PID)
		}
	}
}

// TestClientGroupNotSignalledAfterReap: the client exits and is reaped
// while a member of its group still holds its stdout, so Wait is inside
// WaitDelay; the context ending then sends nothing. The member proves it:
// it is a real process in the group's number, alive before the cancel,
// that must still be alive after it to read a line from a FIFO, say so and
// exit, closing the pipe (a kill(-PID) would have killed it).
func TestClientGroupNotSignalledAfterReap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo, said := filepath.Join(dir, "fifo"), filepath.Join(dir, "said")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, leader, _ := startClient(t, runtest.Patience, `(read x < "$1"; echo survived > "$2") & exit 0`, fifo, said)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := newClientGroup(cmd)
	sent := make(chan bool, 1)
	g.onKill = func(s bool) { sent <- s }
	done := make(chan error, 1)
	go func() { done <- g.wait(ctx) }()

	// The leader gone from /proc is reaped: Wait now waits for the pipe.
	runtest.Eventually(t, "the client to be reaped", func() bool { return reaped(leader.PID) })
	members := runtest.GroupOf(leader.PID, leader.Start)
	if len(members) != 1 {
		t.Fatalf("group %d has %d live members after the client's reap, want its 1 member: %v", leader.PID, len(members), members)
	}

	cancel()
	select {
	case s := <-sent:
		if s {
			t.Fatal("a kill(-PID) was sent after the client was reaped")
		}
	case <-time.After(runtest.Patience):
		t.Fatal("the context's end never reached the group's kill")
	}
	if !proc.Alive(members[0].PID, members[0].Start) {
		t.Fatalf("member %d of group %d died at the cancel", members[0].PID, leader.PID)
	}
	// O_NONBLOCK: ENXIO, not a hang, while no reader has the FIFO open.
	// The member may not have reached its open yet (the subshell is
	// forked before the client exits, its open comes when it is
	// scheduled), so ENXIO is retried while the member lives.
	var w *os.File
	runtest.Eventually(t, "the member to open its FIFO", func() bool {
		var err error
		w, err = os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err == nil {
			return true
		}
		if !errors.Is(err, unix.ENXIO) || !proc.Alive(members[0].PID, members[0].Start) {
			t.Fatalf("the member does not read its FIFO: %v (alive: %v)", err, proc.Alive(members[0].PID, members[0].Start))
		}
		return false
	})
	_, err := w.WriteString("go\n")
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, done); err != nil {
		t.Fatalf("wait = %v, want the client's own exit 0 once the member closed the pipe", err)
	}
	if b, _ := os.ReadFile(said); string(b) != "survived\n" {
		t.Fatalf("the member said %q, want survived", b)
	}
}

// TestClientGroupBlindKillsClientOnly: where the client's exit cannot be
// watched, a context that ends while it runs still kills it, through
// os.Process (by pidfd: never a reaped number), but not its group: the
// member lives on.
func TestClientGroupBlindKillsClientOnly(t *testing.T) {
	t.Parallel()
	memberF := filepath.Join(t.TempDir(), "member")
	cmd, leader, _ := startClient(t, 100*time.Millisecond, `sleep 600 & echo $! > "$1"; wait`, memberF)
	member := memberFrom(t, memberF)
	g := newClientGroup(cmd)
	g.awaitExit = func(int) error { return unix.EMFILE }
	if s := killedAtCancel(t, g); s {
		t.Fatal("a client whose exit could not be watched had its group signalled by number")
	}
	if !proc.Alive(member.PID, member.Start) || member.PGID != leader.PID {
		t.Fatalf("member %d (group %d) was killed: only the client was to be", member.PID, member.PGID)
	}
}

// TestClientGroupWaitResults: waitClient returns what cmd.Wait would, with
// ProcessState set: a client's own exit code, and exec.ErrWaitDelay when it
// exited 0 while a member still held its stdout.
func TestClientGroupWaitResults(t *testing.T) {
	t.Parallel()
	t.Run("exit3", func(t *testing.T) {
		t.Parallel()
		cmd, _, out := startClient(t, 0, `echo hello; exit 3`)
		err := waitClient(context.Background(), cmd)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 || cmd.ProcessState.ExitCode() != 3 {
			t.Fatalf("wait = %v (state %v), want exit 3", err, cmd.ProcessState)
		}
		if out.String() != "hello\n" {
			t.Fatalf("stdout %q", out.String())
		}
	})
	t.Run("waitdelay", func(t *testing.T) {
		t.Parallel()
		cmd, _, _ := startClient(t, 100*time.Millisecond, `sleep 600 & exit 0`)
		err := waitClient(context.Background(), cmd)
		if !errors.Is(err, exec.ErrWaitDelay) || cmd.ProcessState.ExitCode() != 0 {
			t.Fatalf("wait = %v (state %v), want ErrWaitDelay after exit 0", err, cmd.ProcessState)
		}
	})
}
