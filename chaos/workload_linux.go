package chaos

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"time"
)

// shapeScript is the job of a shape: sh or python3, bounded in time so a
// survivor cannot outlive the campaign for long.
func shapeScript(shape string, code int) []string {
	switch shape {
	case "quick":
		return []string{"sh", "-c", fmt.Sprintf("exit %d", code%4)}
	case "pipeline":
		return []string{"sh", "-c", "sleep 60 & yes | head -c 200000 | cat >/dev/null; sleep 60 | cat"}
	case "setsid":
		return []string{"sh", "-c", "setsid sleep 61 & sleep 60"}
	case "termignore":
		return []string{"sh", "-c", "trap '' TERM; sleep 60 & sh -c 'trap \"\" TERM; sleep 60'; wait"}
	case "forkloop":
		return []string{"python3", "-c", `
import os, time
end = time.time() + 45
while time.time() < end:
    pid = os.fork()
    if pid == 0:
        time.sleep(0.2)
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0: pass
    except ChildProcessError: pass
    time.sleep(0.01)
`}
	case "walker":
		// One chain at a time (never more: each parent exits as soon as
		// its child exists), for a bounded time, beside a sleeping leader.
		return []string{"python3", "-c", `
import os, time
end = time.time() + 45
if os.fork() == 0:
    while time.time() < end:
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        time.sleep(0.002)
    os._exit(0)
time.sleep(60)
`}
	case "bigoutput":
		return []string{"sh", "-c", "head -c 8000000 /dev/zero | tr '\\0' x; sleep 60"}
	default: // sleeper
		return []string{"sleep", "60"}
	}
}

// launch starts a run's `run` command.
func (p *player) launch(r *runState) {
	rs := r.spec
	args := []string{"run", "--lease", fmt.Sprint(rs.Lease), "--grace", fmt.Sprint(rs.Grace)}
	if rs.Fg {
		args = append(args, "--no-stream")
	} else {
		args = append(args, "--detach")
	}
	args = append(args, r.id, "--", "env", r.tag)
	args = append(args, shapeScript(rs.Shape, rs.Index)...)
	if rs.SSH {
		args = p.sshArgs(r)
	}
	c := p.command(r.u, args...)
	c.Stdout, c.Stderr = io.Discard, io.Discard
	var errb bytes.Buffer
	c.Stderr = &errb
	p.mu.Lock()
	r.launch = time.Now()
	r.cmd = c
	p.mu.Unlock()
	defer close(r.launched)
	if err := p.start(c); err != nil {
		p.logf("run %d: cannot start: %v", rs.Index, err)
		r.code = -1
		close(r.done)
		return
	}
	p.cov.Run()
	p.logf("run %d launched as %s (pid %d): %s", rs.Index, r.u.name, c.Process.Pid, strings.Join(args, " "))
	go func() {
		c.Wait()
		p.mu.Lock()
		r.code = c.ProcessState.ExitCode()
		r.ended = time.Now()
		p.mu.Unlock()
		p.logf("run %d: `run` exited %d %s", rs.Index, r.code, firstLine(errb.String()))
		close(r.done)
	}()
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if s != "" {
		return "(" + s + ")"
	}
	return ""
}
