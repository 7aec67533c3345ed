package transport

import (
	"context"
	"os/exec"
	"sync"
	"syscall"
)

// An ssh client runs as the leader of a process group of its own
// (clientAttr), with its ProxyCommand, if any, in the same group. When a
// call's context ends before the client exits, the whole group is
// SIGKILLed: kill(-PID). That number names the client's group only while
// the client is unreaped: once Wait has reaped it and no member is left,
// the kernel may give the number to an unrelated process, and so its
// group, and a kill(-PID) then would hit that. exec.Cmd.Wait reaps the
// client first and only then waits (up to WaitDelay) for its pipes, so a
// context that ends in that window must not signal anything.
//
// clientGroup is the one place that rule lives. Its waiting path first
// waits for the client's exit without reaping it (awaitExit: waitid with
// WNOWAIT on Linux, a kqueue NOTE_EXIT event on macOS and FreeBSD), then,
// under the mutex the killer takes too, marks the group as no longer to be
// signalled, and only then calls cmd.Wait, which reaps the client (Go's
// Wait stays the one that reaps, so the ProcessState and the exit code are
// Go's own). The killer sends kill(-PID) only while that mark is unset,
// that is while the client is known unreaped: between the kill and the
// mark the number cannot change hands.
//
// A context that ends after the client exited signals nothing, not even a
// ProxyCommand that outlived it (ssh hangs up its ProxyCommand when it
// exits; one that lingers ends when its pipes close).
type clientGroup struct {
	cmd *exec.Cmd
	pid int

	mu sync.Mutex
	// exited: the client has exited (awaitExit returned) or been waited
	// for; its group is not to be signalled by number any more.
	exited bool
	// blind: its exit cannot be watched (awaitExit failed), so it may be
	// reaped at any moment; a kill goes to the client alone, through
	// os.Process.
	blind bool

	// awaitExit is awaitExit (tests make it fail, as a system out of
	// file descriptors would make it).
	awaitExit func(pid int) error
	// onKill, if set (tests), is called by each kill with whether it
	// sent the group its signal.
	onKill func(sent bool)
}

// newClientGroup is the group of cmd, a client started with clientAttr.
func newClientGroup(cmd *exec.Cmd) *clientGroup {
	return &clientGroup{cmd: cmd, pid: cmd.Process.Pid, awaitExit: awaitExit}
}

// waitClient waits for cmd, a client started with clientAttr, as
// cmd.Wait does (same error, same ProcessState), and kills its process
// group if ctx ends while the client runs. The orphan guard (orphan.go)
// holds the group until the client has exited.
func waitClient(ctx context.Context, cmd *exec.Cmd) error {
	return newClientGroup(cmd).wait(ctx)
}

// wait is waitClient.
func (g *clientGroup) wait(ctx context.Context) error {
	release := guardClient(g.pid)
	stop := context.AfterFunc(ctx, g.kill)
	err := g.awaitExit(g.pid)
	g.mu.Lock()
	if err != nil {
		// Go's Wait below blocks until the client exits; a kill in the
		// meantime must still reach the client.
		g.blind = true
	} else {
		g.exited = true
	}
	g.mu.Unlock()
	if err == nil {
		// The guard, too, kills by number: off it before the reap.
		release()
	}
	werr := g.cmd.Wait() // reaps the client, then waits for its pipes
	g.mu.Lock()
	g.exited = true
	g.mu.Unlock()
	stop()
	if err != nil {
		release()
	}
	return werr
}

// kill SIGKILLs the client's group if the client is known unreaped.
func (g *clientGroup) kill() {
	g.mu.Lock()
	defer g.mu.Unlock()
	sent := false
	switch {
	case g.exited:
	case g.blind:
		// os.Process does not signal a process its Wait has reaped
		// (by pidfd on Linux; on FreeBSD it waits with wait6 WNOWAIT
		// first, as awaitExit would; macOS's Go has no such guard).
		_ = g.cmd.Process.Kill()
	default:
		_ = syscall.Kill(-g.pid, syscall.SIGKILL)
		sent = true
	}
	if g.onKill != nil {
		g.onKill(sent)
	}
}
