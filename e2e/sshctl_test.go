package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/relay"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// The controller (`agent-wrap ssh`) under test: each test runs the real
// agent-wrap binary as the controller, its every connection going through
// a relay the test controls (-o ProxyCommand=) to a real sshd on 127.0.0.1.

// ctlHarness is one test's sshd, relay, run root and ledger.
type ctlHarness struct {
	*harness
	rl     *relay.Relay
	ledger string // a directory, or a database's URL (newPGCtlHarness)
	events string
	env    []string // added to the environment of the binary's runs
}

func newCtlHarness(t *testing.T, opts ...sshtest.Option) *ctlHarness {
	t.Helper()
	h := newHarness(t, opts...)
	dir := t.TempDir()
	return &ctlHarness{
		harness: h,
		rl:      relay.Start(t, h.srv.Host()+":"+strconv.Itoa(h.srv.Port())),
		ledger:  filepath.Join(dir, "ledger"),
		events:  filepath.Join(dir, "events.jsonl"),
	}
}

// rsh is the --rsh value: the test server's ssh options, through the relay,
// with keepalives that notice a blackhole within about 3 s.
func (c *ctlHarness) rsh(first ...string) string {
	args := append(append([]string{"ssh"}, first...), c.srv.SSHArgs()...)
	args = append(args, "-o", "ProxyCommand="+c.rl.ProxyCommand(),
		"-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=3")
	return sshtest.Quote(args...)
}

// ctl is one controller process.
type ctl struct {
	cmd   *exec.Cmd
	out   runtest.Buffer
	errb  runtest.Buffer
	group *runtest.Group
}

// start runs `agent-wrap ssh` with flags for run id and argv.
func (c *ctlHarness) start(id string, flags []string, argv ...string) *ctl {
	c.t.Helper()
	return c.startTo(c.srv.Destination(), id, flags, argv...)
}

// startTo is start with the destination dest.
func (c *ctlHarness) startTo(dest, id string, flags []string, argv ...string) *ctl {
	c.t.Helper()
	return startCtlEnv(c.t, c.env, c.sshArgs(dest, id, flags, argv...))
}

// sshArgs are the arguments of `agent-wrap ssh` to dest for run id.
func (c *ctlHarness) sshArgs(dest, id string, flags []string, argv ...string) []string {
	args := []string{"ssh", "--rsh", c.rsh(), "--remote-bin", bin, "--remote-root", c.root,
		"--ledger", c.ledger, "--events", c.events, "--id", id}
	args = append(args, flags...)
	args = append(args, dest, "--")
	return append(args, argv...)
}

// startCtl starts bin with args in a process group of its own, its output
// kept; cleanup KILLs the group and fails the test if any of it survives.
func startCtl(t *testing.T, args []string) *ctl {
	t.Helper()
	return startCtlEnv(t, nil, args)
}

// startCtlEnv is startCtl with env added to the test's environment.
func startCtlEnv(t *testing.T, env, args []string) *ctl {
	t.Helper()
	return startCtlIn(t, env, args, nil)
}

// startCtlIn is startCtlEnv with stdin as the controller's stdin (nil:
// /dev/null).
func startCtlIn(t *testing.T, env, args []string, stdin io.Reader) *ctl {
	t.Helper()
	k := &ctl{cmd: exec.Command(bin, args...)}
	k.cmd.Stdin = stdin
	// The controller's ControlMasters (--mux auto) in a directory of this
	// test's, not the user's machine-wide one.
	k.cmd.Env = append(append(os.Environ(), "AGENT_WRAP_MUX_DIR="+muxDirFor(t)), env...)
	k.startIn(t)
	return k
}

// startIn starts the controller's command in a process group of its own,
// its output kept; cleanup KILLs the group and fails the test if any of it
// survives.
func (k *ctl) startIn(t *testing.T) {
	t.Helper()
	k.cmd.Stdout, k.cmd.Stderr = &k.out, &k.errb
	k.group = runtest.StartInGroup(t, k.cmd)
}

// waitOut waits for the controller's stdout to hold s; if it does not
// within runtest.Patience, the test fails with what the controller said
// and whether it is still running.
func (k *ctl) waitOut(t *testing.T, what, s string) {
	t.Helper()
	if runtest.Within(runtest.Patience, func() bool { return strings.Contains(k.stdout(), s) }) {
		return
	}
	state := "still running"
	select {
	case <-k.group.Done():
		state = fmt.Sprintf("exited %d", exitCode(k.group.Err()))
	default:
	}
	t.Fatalf("gave up after %v waiting for %s; the controller (pid %d) is %s\nstdout: %s\nstderr: %s",
		runtest.Patience, what, k.cmd.Process.Pid, state, tail(k.stdout()), k.stderr())
}

func (k *ctl) stdout() string { return k.out.String() }
func (k *ctl) stderr() string { return k.errb.String() }

func (k *ctl) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := k.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling the controller: %v", err)
	}
}

// wait waits for the controller's exit code.
func (k *ctl) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-k.group.Done():
	case <-time.After(2 * waitLong):
		t.Fatalf("controller still running after %v\nstdout: %s\nstderr: %s", 2*waitLong, tail(k.stdout()), k.stderr())
	}
	var words []string
	for _, l := range strings.Split(k.stderr(), "\n") {
		if strings.HasPrefix(l, "agent-wrap: ") {
			words = append(words, l)
		}
	}
	t.Logf("controller exit %d; its own words:\n%s", exitCode(k.group.Err()), strings.Join(words, "\n"))
	return exitCode(k.group.Err())
}

// attachClient returns the PID of the controller's ssh client running
// `attach` (a child of the controller, chosen by its command line among
// the controller's own children), or 0.
func (k *ctl) attachClient() int {
	for _, st := range childrenOf(k.cmd.Process.Pid) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/cmdline")
		if bytes.Contains(b, []byte(" attach ")) {
			return st.PID
		}
	}
	return 0
}

// ledgerRec reads the run's ledger record.
func (c *ctlHarness) ledgerRec(id string) ledger.Record {
	c.t.Helper()
	if ledger.IsURL(c.ledger) {
		return *pgRec(c.t, c.ledger, id)
	}
	var r ledger.Record
	b, err := os.ReadFile(filepath.Join(c.ledger, id+".json"))
	if err != nil {
		c.t.Fatalf("ledger: %v", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		c.t.Fatalf("ledger %s: %v", id, err)
	}
	return r
}

// wantSettled checks the ledger's final word on a run.
func (c *ctlHarness) wantSettled(id, outcome, cause string, code int) {
	c.t.Helper()
	r := c.ledgerRec(id)
	if r.State != ledger.Settled || r.Outcome != outcome || cause != "" && r.Cause != cause || r.ExitCode == nil || *r.ExitCode != code {
		got := -1
		if r.ExitCode != nil {
			got = *r.ExitCode
		}
		c.t.Errorf("ledger %s: state=%s outcome=%s cause=%s exit=%d reason=%q; want settled %s cause=%q exit %d",
			id, r.State, r.Outcome, r.Cause, got, r.Reason, outcome, cause, code)
	}
}

// ctlEvents returns the controller events of run id, in order.
func (c *ctlHarness) ctlEvents(id string) []string {
	b, _ := os.ReadFile(c.events)
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["run_id"] == id {
			names = append(names, m["event"].(string))
		}
	}
	return names
}

// waitEvent waits until run id's controller events include name, after
// skip events.
func (c *ctlHarness) waitEvent(id, name string, after int) {
	c.t.Helper()
	runtest.Eventually(c.t, "controller event "+name, func() bool {
		ev := c.ctlEvents(id)
		return len(ev) > after && contains(ev[after:], name)
	})
}

// treeGone checks from the host's /proc that nothing of the run's recorded
// process group is alive.
func (c *ctlHarness) treeGone(id string) {
	c.t.Helper()
	r, err := c.status(id)
	if err != nil || r.PGID == 0 {
		c.t.Fatalf("run %s: no recorded pgid (%v)", id, err)
	}
	waitGroupEmpty(c.t, r.PGID)
}

// settle runs `agent-wrap settle` on the test's ledger.
func (c *ctlHarness) settle(args ...string) (int, string) {
	c.t.Helper()
	cmd := exec.Command(bin, append([]string{"settle", "--ledger", c.ledger}, args...)...)
	cmd.Env = append(os.Environ(), c.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return exitCode(err), out.String()
}

// execBin runs the agent-wrap binary and returns its combined output.
func execBin(args ...string) (string, error) {
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

var muxDirs sync.Map // *testing.T -> its AGENT_WRAP_MUX_DIR

// muxDirFor returns t's directory for the controllers' ControlMaster
// sockets: short (a socket path is at most 104 bytes on some systems),
// mode 0700, removed at the end of the test.
func muxDirFor(t *testing.T) string {
	if d, ok := muxDirs.Load(t); ok {
		return d.(string)
	}
	d, err := os.MkdirTemp("", "awmux-")
	if err != nil {
		t.Fatal(err)
	}
	muxDirs.Store(t, d)
	t.Cleanup(func() { os.RemoveAll(d); muxDirs.Delete(t) })
	return d
}
