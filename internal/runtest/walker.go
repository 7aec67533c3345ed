package runtest

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

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

// walkerScript is a job that walks away from every look: each of its
// processes ignores TERM, forks a child that calls setsid and carries on,
// and exits. Its PID, process group and session are new every few hundred
// microseconds, and its parent has always just exited. Every process it
// makes appends "PID START" (start time in clock ticks) to the log before
// it forks, so a test can check that each one is dead. It stops walking by
// itself at the Unix time it is given, so a test that fails cannot leave it
// running for long.
//
// Modes: "leader", the job's leader walks itself (it exits at once, and
// the run's leader is gone while its walkers live on); "children", the
// leader starts one walker and waits, as a shell would, until the end.
const walkerScript = `import os, signal, sys, time
log, until, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def note():
    with open('/proc/self/stat', 'rb') as f:
        st = f.read()
    start = st[st.rindex(b')') + 2:].split()[19]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'%d %s\n' % (os.getpid(), start))
    os.close(fd)
note()
if mode == 'children':
    if os.fork() > 0:
        while time.time() < until:
            time.sleep(0.2)
        os._exit(0)
    os.setsid()
    note()
while time.time() < until:
    if os.fork() == 0:
        os.setsid()
        note()
        continue
    os._exit(0)
os._exit(0)
`

// Walker is a walking job (see walkerScript) prepared for one test.
type Walker struct {
	// Argv is the job's command line, to run under agent-wrap.
	Argv []string
	// Log is the file every process of the job appends itself to.
	Log string
}

// python is the interpreter the walker runs on: the system's, which any
// user may run.
func python(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("the walking job needs python3: %v", err)
	}
	return p
}

// NewWalker prepares a walking job in mode "leader" or "children" that
// stops by itself after life, readable and writable by uid (-1: the test's
// own user). When the test ends, every process it recorded that still runs
// is frozen and KILLed, by PID and start time, until none is left.
func NewWalker(t testing.TB, mode string, life time.Duration, uid int) *Walker {
	t.Helper()
	dir, err := os.MkdirTemp("", "aw-walker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "walker.py")
	if err := os.WriteFile(script, []byte(walkerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &Walker{Log: filepath.Join(dir, "pids")}
	if err := os.WriteFile(w.Log, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if uid >= 0 {
		if err := os.Chown(w.Log, uid, -1); err != nil {
			t.Fatal(err)
		}
	}
	until := float64(time.Now().Add(life).UnixNano()) / 1e9
	w.Argv = []string{python(t), script, w.Log, strconv.FormatFloat(until, 'f', 3, 64), mode}
	t.Cleanup(func() {
		// Two empty looks in a row, as a stop proves it is over; the
		// walker ends by itself at its time anyway.
		empty := 0
		Within(Patience, func() bool {
			live := w.Alive()
			for _, id := range live {
				_ = stop.Signal(id, unix.SIGSTOP)
				_ = stop.Signal(id, unix.SIGKILL)
			}
			if len(live) == 0 {
				empty++
			} else {
				empty = 0
			}
			return empty >= 2
		})
	})
	return w
}

// Made returns every process the walker recorded, in order.
func (w *Walker) Made() []proc.Identity {
	b, _ := os.ReadFile(w.Log)
	var out []proc.Identity
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		start, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 == nil && err2 == nil {
			out = append(out, proc.Identity{PID: pid, Start: start})
		}
	}
	return out
}

// Alive returns the recorded processes that still run (a zombie is dead).
func (w *Walker) Alive() []proc.Identity {
	var out []proc.Identity
	for _, id := range w.Made() {
		if proc.Alive(id.PID, id.Start) {
			out = append(out, id)
		}
	}
	return out
}

// WaitWalking waits until the walker has made n processes.
func (w *Walker) WaitWalking(t testing.TB, n int) {
	t.Helper()
	Eventually(t, fmt.Sprintf("the walker to make %d processes", n), func() bool { return len(w.Made()) >= n })
}

// AssertAllDead fails the test, naming them, if any process the walker
// recorded still runs; it also fails if the walker recorded a process
// after the check began (one it was making when it was looked at).
func (w *Walker) AssertAllDead(t testing.TB) {
	t.Helper()
	before := len(w.Made())
	if live := w.Alive(); len(live) > 0 {
		t.Fatalf("%d of the walker's %d processes survived: %v", len(live), before, live)
	}
	if after := len(w.Made()); after != before {
		t.Fatalf("the walker made %d more processes after it was stopped", after-before)
	}
}

// User is a second account a test runs agent-wrap as: it cannot create a
// cgroup below root's, so its runs fall back to the session and the
// wrapper's subreaper tree, as on a host that delegates no cgroup.
type User struct {
	UID, GID int
	// Bin is a copy of the binary that the user may run.
	Bin string
}

// SecondUser adds a system user for the test with useradd (removed with
// userdel when the test ends) and copies the binary where it may run it.
// The tests run as root; elsewhere the test fails, saying why.
func SecondUser(t testing.TB) *User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("a second user needs root to create it (useradd); run the tests as root")
	}
	name := fmt.Sprintf("aw%d%d", os.Getpid()%100000, time.Now().UnixNano()%1000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		// userdel refuses while a process of the user exists, a zombie
		// that PID 1 has not reaped yet included.
		var out []byte
		var err error
		if !Within(10*time.Second, func() bool {
			out, err = exec.Command("userdel", name).CombinedOutput()
			return err == nil
		}) {
			t.Logf("userdel %s: %v: %s", name, err, out)
		}
	})
	u := &User{}
	for _, f := range []struct {
		flag string
		v    *int
	}{{"-u", &u.UID}, {"-g", &u.GID}} {
		out, err := exec.Command("id", f.flag, name).Output()
		if err != nil {
			t.Fatalf("id %s %s: %v", f.flag, name, err)
		}
		if *f.v, err = strconv.Atoi(strings.TrimSpace(string(out))); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("", "aw-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Bin = filepath.Join(dir, "agent-wrap")
	if err := os.WriteFile(u.Bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return u
}

// Root makes a run root the user owns (mode 0700) and returns its path.
func (u *User) Root(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "aw-userroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "runs")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(root, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	return root
}

// As is a StartWith setup that runs the command as the user, with its copy
// of the binary and a plain environment.
func (u *User) As(c *exec.Cmd) {
	c.Path, c.Args[0] = u.Bin, u.Bin
	var root string
	for _, e := range c.Env {
		if strings.HasPrefix(e, "AGENT_WRAP_ROOT=") {
			root = e
		}
	}
	c.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", root}
	c.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}
}
