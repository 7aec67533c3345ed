// Package runtest holds what agent-wrap's process tests share: the real
// binary built once per test process, conditions waited for with generous
// deadlines (never fixed sleeps), and facts about a run read from its run
// directory and the real /proc. Cleanup kills what a test started by the
// recorded process group and PIDs, never by name.
package runtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// Patience is how long a test waits for a condition before failing. The
// machines are shared and loaded, so it is generous; a passing test never
// waits that long.
const Patience = 30 * time.Second

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary returns the path of an agent-wrap binary built from this module,
// once per test process (static, as shipped).
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = fmt.Errorf("go env GOMOD: %v", err)
			return
		}
		modRoot := filepath.Dir(strings.TrimSpace(string(out)))
		dir, err := os.MkdirTemp("", "agent-wrap-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "agent-wrap")
		cmd := exec.Command("go", "build", "-trimpath", "-o", binPath, "./cmd/agent-wrap")
		cmd.Dir = modRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Eventually waits until cond is true, polling with a short backoff, and
// fails the test with msg if Patience passes first.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Within(Patience, cond) {
		t.Fatalf("gave up after %v waiting for %s", Patience, what)
	}
}

// Within polls cond until it is true or d passes; it reports whether cond
// became true.
func Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	wait := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

// Run is a run under a test's root.
type Run struct {
	Root, ID string
}

// Dir is the run directory.
func (r Run) Dir() string { return filepath.Join(r.Root, r.ID) }

// File reads a file of the run directory ("" if missing).
func (r Run) File(name string) string {
	b, _ := os.ReadFile(filepath.Join(r.Dir(), name))
	return string(b)
}

// ReadStatus reads and parses status.json.
func (r Run) ReadStatus() (*statusfile.Record, error) {
	b, err := os.ReadFile(filepath.Join(r.Dir(), "status.json"))
	if err != nil {
		return nil, err
	}
	rec, err := statusfile.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%v\n%s", err, b)
	}
	return rec, nil
}

// Status reads and parses status.json; nil if missing or unparseable.
func (r Run) Status() *statusfile.Record {
	rec, _ := r.ReadStatus()
	return rec
}

// MustStatus is Status that fails the test when there is no valid record.
func (r Run) MustStatus(t testing.TB) *statusfile.Record {
	t.Helper()
	rec, err := r.ReadStatus()
	if err != nil {
		t.Fatalf("run %s: %v", r.ID, err)
	}
	return rec
}

// WaitState waits until the run's state is one of states and returns it.
func (r Run) WaitState(t testing.TB, states ...string) *statusfile.Record {
	t.Helper()
	var rec *statusfile.Record
	Eventually(t, fmt.Sprintf("run %s to be %v", r.ID, states), func() bool {
		rec = r.Status()
		if rec == nil {
			return false
		}
		for _, s := range states {
			if rec.State == s {
				return true
			}
		}
		return false
	})
	return rec
}

// Journal parses events.jsonl.
func (r Run) Journal(t testing.TB) []journal.Entry {
	t.Helper()
	f, err := os.Open(filepath.Join(r.Dir(), "events.jsonl"))
	if err != nil {
		t.Fatalf("run %s: %v", r.ID, err)
	}
	defer f.Close()
	es, err := journal.ReadAll(f)
	if err != nil {
		t.Fatalf("run %s: journal: %v", r.ID, err)
	}
	return es
}

// Events returns the names of the journal's events in order.
func (r Run) Events(t testing.TB) []string {
	var out []string
	for _, e := range r.Journal(t) {
		out = append(out, e.Event)
	}
	return out
}

// PGID is the recorded process group (0 if not recorded yet).
func (r Run) PGID() int {
	v, _ := strconv.Atoi(strings.TrimSpace(r.File("pgid")))
	return v
}

// Members returns the live (not zombie) processes in process group pgid,
// read from the real /proc.
func Members(pgid int) []proc.Stat {
	if pgid <= 1 {
		return nil
	}
	out, _ := proc.ScanInto(nil, func(p proc.Stat) bool { return p.PGID == pgid && !p.Dead() })
	return out
}

// groupMembers is Members of the run's recorded group, unless the group's
// number has been recycled since the run ended: when a live process at the
// leader's PID has another start time than the recorded leader_start, the
// group is someone else's (another test's, another program's) and none of
// it is the run's. Members started before the leader are not the run's
// either. Without a readable record naming the leader's start time it is
// Members of the pgid file's group.
func (r Run) groupMembers() []proc.Stat {
	pg := r.PGID()
	rec := r.Status()
	if pg <= 1 {
		return nil
	}
	if rec == nil || rec.LeaderStart == 0 {
		// A test that broke the record: the pgid file is all there is.
		return Members(pg)
	}
	return GroupOf(pg, rec.LeaderStart)
}

// GroupOf lists the live members of the process group a test started with
// leader pgid at leaderStart, and none of a group that took the number
// since. The kernel does not hand out a PID while a group of that ID has a
// member, so a group is another's only once every member of ours is gone:
// then a process now at pgid started at another time, or a member older
// than our leader, is not ours.
func GroupOf(pgid int, leaderStart uint64) []proc.Stat {
	if pgid <= 1 {
		return nil
	}
	if st, err := proc.ReadStat(pgid); err == nil && st.Start != leaderStart {
		return nil
	}
	var out []proc.Stat
	for _, p := range Members(pgid) {
		if p.Start >= leaderStart {
			out = append(out, p)
		}
	}
	return out
}

// KillGroup is test cleanup by recorded process group: SIGKILL to each
// member GroupOf finds, each checked against its start time as it is
// signalled. Never a bare kill(-pgid): once our group is gone its number
// can be another's, on a machine that other tests share.
func KillGroup(pgid int, leaderStart uint64) {
	SignalGroup(pgid, leaderStart, unix.SIGKILL)
}

// SignalGroup sends sig to each member GroupOf finds, each checked against
// its start time as it is signalled.
func SignalGroup(pgid int, leaderStart uint64, sig unix.Signal) {
	for _, p := range GroupOf(pgid, leaderStart) {
		_ = stop.Signal(proc.Identity{PID: p.PID, Start: p.Start, PGID: p.PGID}, sig)
	}
}

// AssertGroupEmpty fails loudly, naming every survivor, if any process of
// the run's recorded group or any recorded escaped descendant still runs.
func (r Run) AssertGroupEmpty(t testing.TB) {
	t.Helper()
	if bad := r.Survivors(); len(bad) > 0 {
		t.Fatalf("run %s: processes survived:\n  %s", r.ID, strings.Join(bad, "\n  "))
	}
}

// Survivors describes, one line each, every process of the run's recorded
// group and every recorded escaped descendant that still runs (a zombie
// counts as dead); none when the run left nothing behind.
func (r Run) Survivors() []string {
	var bad []string
	for _, p := range r.groupMembers() {
		argv, _ := proc.Cmdline(p.PID)
		bad = append(bad, fmt.Sprintf("pid %d (%s) state %c in group %d", p.PID, strings.Join(argv, " "), p.State, p.PGID))
	}
	if rec := r.Status(); rec != nil {
		for _, e := range rec.Escaped {
			if proc.Alive(e.PID, e.Start) {
				bad = append(bad, fmt.Sprintf("escaped pid %d (%s) still runs", e.PID, strings.Join(e.Argv, " ")))
			}
		}
	}
	return bad
}

// Kill kills whatever is left of the run, by its recorded group and escaped
// PIDs (validated by start time) and its recorded wrapper: test cleanup.
func (r Run) Kill() {
	for _, p := range r.groupMembers() {
		_ = stop.Signal(proc.Identity{PID: p.PID, Start: p.Start, PGID: p.PGID}, unix.SIGKILL)
	}
	if rec := r.Status(); rec != nil {
		for _, e := range rec.Escaped {
			_ = stop.Signal(proc.Identity{PID: e.PID, Start: e.Start}, unix.SIGKILL)
		}
		if rec.WrapperPID > 1 && rec.WrapperPID != os.Getpid() {
			_ = stop.Signal(proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}, unix.SIGKILL)
		}
		if rec.Cgroup != "" && cgroup.Valid(rec.Cgroup) {
			_ = stop.KillCgroup(rec.Cgroup)
			// The cgroup can go once its last process has exited.
			Within(10*time.Second, func() bool { return cgroup.Remove(rec.Cgroup) == nil })
		}
	}
}

// KillRuns is Kill for every run under root: test cleanup that leaves
// nothing of a test's runs, whether it passed or not. It reports nothing;
// the tests judge.
func KillRuns(root string) {
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() {
			Run{Root: root, ID: e.Name()}.Kill()
		}
	}
}

// Cmd is an agent-wrap process started by a test, the leader of a process
// group of its own.
type Cmd struct {
	*exec.Cmd
	Stdout, Stderr Buffer
	group          *Group
}

// Buffer collects a process's output; it may be read while the process is
// still writing it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns a copy of what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Bytes returns a copy of what was written so far.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.b.Bytes())
}

// Len is the number of bytes written so far.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}

// Start starts the binary with args and AGENT_WRAP_ROOT=root, in its own
// process group (so a test can signal it without signalling itself), and
// registers cleanup that kills the group by identity and fails the test if
// any of it survives (StartInGroup).
func Start(t testing.TB, root string, args ...string) *Cmd {
	t.Helper()
	return StartWith(t, root, nil, args...)
}

// StartWith is Start with setup applied to the command before it starts
// (to add to its environment, give it a stdin, run it as another user).
func StartWith(t testing.TB, root string, setup func(*exec.Cmd), args ...string) *Cmd {
	t.Helper()
	c := &Cmd{Cmd: exec.Command(Binary(t), args...)}
	c.Env = append(os.Environ(), "AGENT_WRAP_ROOT="+root)
	c.Cmd.Stdout, c.Cmd.Stderr = &c.Stdout, &c.Stderr
	c.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	if setup != nil {
		setup(c.Cmd)
	}
	c.group = StartInGroup(t, c.Cmd)
	return c
}

// Wait waits (with Patience) for the process and returns its exit code.
func (c *Cmd) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-c.group.Done():
	case <-time.After(Patience):
		// Kill it and let exec's copying goroutines finish before the
		// buffers are read.
		_ = c.Process.Kill()
		<-c.group.Done()
		t.Fatalf("%v did not exit within %v\nstderr: %s", c.Args, Patience, c.Stderr.String())
	}
	return c.ProcessState.ExitCode()
}

// Exited reports whether the process has exited.
func (c *Cmd) Exited() bool { return c.group.Exited() }

// Exec runs the binary to completion and returns its exit code, stdout and
// stderr.
func Exec(t testing.TB, root string, args ...string) (int, string, string) {
	t.Helper()
	c := Start(t, root, args...)
	code := c.Wait(t)
	return code, c.Stdout.String(), c.Stderr.String()
}

// NewRoot returns a fresh run root in a test temp dir.
func NewRoot(t testing.TB) string {
	return filepath.Join(t.TempDir(), "runs")
}

// RunDir creates run id in a new root of its own and returns its
// directory, open; the root and the directory are closed when the test
// ends.
func RunDir(t testing.TB, id string) *rundir.Dir {
	t.Helper()
	return RunDirAt(t, NewRoot(t), id)
}

// RunDirAt is RunDir under the root at path (made if missing), on a tmpfs
// of the test's, say.
func RunDirAt(t testing.TB, path, id string) *rundir.Dir {
	t.Helper()
	root, err := rundir.OpenRoot(path, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	d, err := root.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// JSON decodes one JSON object.
func JSON(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return m
}

// LiveAndFinished starts, with the real binary under root, a detached live
// run (lease 120s, a sleep) and a run that finished with code 3, and
// registers cleanup that kills what is left of the live one by its recorded
// group: the two answers a host gives, still running and over.
func LiveAndFinished(t testing.TB, root, live, done string) {
	t.Helper()
	t.Cleanup(Run{Root: root, ID: live}.Kill)
	if code, out, errs := Exec(t, root, "run", "--detach", "--lease", "120s", live, "--", "sleep", "300"); code != 0 {
		t.Fatalf("run --detach %s: exit %d\n%s%s", live, code, out, errs)
	}
	if code, out, errs := Exec(t, root, "run", done, "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("run %s: exit %d, want 3\n%s%s", done, code, out, errs)
	}
}
