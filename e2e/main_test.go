// Package e2e proves agent-wrap's promises where they matter: through the real
// OpenSSH client and server on 127.0.0.1 (internal/sshtest), driving the
// static binary built once in TestMain, with --root pointed at a temp dir per
// test.
//
// The tests judge processes from the real /proc (a zombie counts as dead) and,
// in cleanup, kill what a run left behind by the PIDs and process group
// recorded in its run directory, checked against their start times; never by
// name.
//
// The host side driven over ssh, one test each, all in parallel:
//
//	TestDisconnectNoPTYRunsUntilLease   no PTY, client SIGKILLed, the lease ends it
//	TestDisconnectPTYHangupCancels      ssh -tt, client killed: signal:HUP
//	TestDisconnectPTYHangupIgnored      the same with --on-hangup ignore
//	TestCancelOverSecondConnection      cancel while the first connection streams
//	TestStream10MBByteIdentical         10 MB through ssh, byte for byte
//	TestCancelLeavesOtherRunAlone       two runs, one cancelled
//	TestControllerLoop                  testdata/controller.sh
//	TestDetachOverSSH                   run --detach over ssh -tt, then logs -f, cancel, wait
//	TestWatchdogStopsRunOfDeadWrapper   wrapper SIGKILLed: watchdog --once enforces the lease
//
// Run them with `go test ./e2e` (as root, with openssh-server installed;
// without it the package fails at once, naming what to install). the by-hand
// sections of docs/guide.md are what these tests back.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/relay"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// bin is the absolute path of the agent-wrap binary built by TestMain.
var bin string

// hostScript writes dir/agent-wrap, a remote agent-wrap for a host that
// misbehaves: a shell script that runs first (shell lines, each ending
// in a newline, the arguments in "$@"), then execs the real binary.
func hostScript(t testing.TB, dir, first string) string {
	t.Helper()
	path := filepath.Join(dir, "agent-wrap")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+first+"exec "+bin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitLong bounds every wait on a condition: generous, because the machines
// running these tests are shared and every ssh login runs the remote user's
// shell startup files.
const waitLong = runtest.Patience

func TestMain(m *testing.M) {
	relay.Connector() // the test binary as ssh's ProxyCommand (ssh_test.go)
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	// Every test here needs OpenSSH. Without it they would all skip and
	// the package would print "ok": fail at once instead, saying why.
	if err := sshtest.Missing(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: every test here runs through a real OpenSSH server, and %v\n"+
			"e2e: install it with: apt-get install openssh-server openssh-client (or run .ci/deps as root)\n", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "agent-wrap-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "agent-wrap")
	build := exec.Command("go", "build", "-o", bin, "./cmd/agent-wrap")
	build.Dir = ".." // the module root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building agent-wrap: %v\n%s", err, out)
		return 1
	}
	defer stopSharedPG() // if a test started it
	runtest.MoreAtOnce(e2eParallel)
	return m.Run()
}

// e2eParallel is how many tests run at once here (runtest.MoreAtOnce):
// each waits on ssh, leases and graces, with an sshd of its own.
const e2eParallel = 4

// harness is one test's sshd, run root and helpers.
type harness struct {
	t    *testing.T
	srv  *sshtest.Server
	root string
}

func newHarness(t *testing.T, opts ...sshtest.Option) *harness {
	t.Helper()
	h := &harness{t: t, srv: sshtest.Start(t, opts...), root: t.TempDir()}
	t.Cleanup(h.killRuns)
	return h
}

// line returns the remote command line `BIN --root ROOT args...`, quoted.
func (h *harness) line(args ...string) string {
	return sshtest.Quote(append([]string{bin, "--root", h.root}, args...)...)
}

// result is a finished ssh command.
type result struct {
	stdout, stderr string
	code           int // the remote exit status as ssh reports it; -1 if killed
}

// ssh runs agent-wrap args over a new connection and waits for it.
func (h *harness) ssh(args ...string) result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	cmd := h.srv.Command(ctx, h.line(args...))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), code: exitCode(err)}
	if r.code == 255 || r.code == -1 {
		h.t.Fatalf("ssh agent-wrap %s: %v (ssh itself failed)\nstderr: %s\nsshd log:\n%s",
			strings.Join(args, " "), err, r.stderr, h.srv.Log())
	}
	h.t.Logf("ssh agent-wrap %s: exit %d", strings.Join(args, " "), r.code)
	return r
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// stream is an ssh client left running in the background: typically a
// streaming `agent-wrap run`.
type stream struct {
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	out    runtest.Buffer // stdout so far
	errb   runtest.Buffer // stderr so far
	done   chan struct{}
	err    error // cmd.Wait's, once done is closed
	copied chan struct{}
}

// start runs agent-wrap args over a new connection in the background, with
// sshOpts (e.g. -tt) before the destination. Its stdin is a pipe held open
// until the stream ends. Cleanup kills the local client if it still runs.
func (h *harness) start(sshOpts []string, args ...string) *stream {
	h.t.Helper()
	s := &stream{done: make(chan struct{}), copied: make(chan struct{})}
	s.cmd = h.srv.CommandWith(context.Background(), sshOpts, h.line(args...))
	stdin, err := s.cmd.StdinPipe()
	if err != nil {
		h.t.Fatal(err)
	}
	s.stdin = stdin
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		h.t.Fatal(err)
	}
	s.cmd.Stderr = &s.errb
	if err := s.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() {
		r := bufio.NewReaderSize(stdout, 1<<16)
		buf := make([]byte, 1<<16)
		for {
			n, err := r.Read(buf)
			s.out.Write(buf[:n])
			if err != nil {
				break
			}
		}
		close(s.copied)
	}()
	go func() {
		<-s.copied
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	h.t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// stdout returns what the stream has printed so far.
func (s *stream) stdout() string { return s.out.String() }

func (s *stream) stderr() string { return s.errb.String() }

// kill SIGKILLs the local ssh client, as a crashing controller would be.
func (s *stream) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatalf("killing local ssh: %v", err)
	}
}

// wait waits for the local ssh client to end and returns its exit code.
func (s *stream) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(waitLong):
		t.Fatalf("ssh still running after %v; stdout so far:\n%s\nstderr:\n%s", waitLong, tail(s.stdout()), s.stderr())
	}
	_ = s.stdin.Close()
	return exitCode(s.err)
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}

// record is a run's status.json as runtest reads it, with the one-line
// summary the tests print.
type record struct{ statusfile.Record }

func (r record) terminal() bool { return statusfile.Terminal(r.State) }

func (r record) String() string {
	code := "none"
	if r.ExitCode != nil {
		code = strconv.Itoa(*r.ExitCode)
	}
	return fmt.Sprintf("state=%s cause=%s exit_code=%s signal=%s pid=%d wrapper=%d survivors=%v",
		r.State, r.Cause, code, r.Signal, r.PID, r.WrapperPID, r.Survivors)
}

// status reads ROOT/id/status.json directly (the test runs on the host).
func (h *harness) status(id string) (record, error) {
	rec, err := runtest.Run{Root: h.root, ID: id}.ReadStatus()
	if err != nil {
		return record{}, err
	}
	return record{*rec}, nil
}

// waitState waits until the run's record satisfies cond and returns it.
func (h *harness) waitState(id, what string, cond func(record) bool) record {
	h.t.Helper()
	var last record
	var lastErr error
	if !runtest.Within(runtest.Patience, func() bool {
		last, lastErr = h.status(id)
		return lastErr == nil && cond(last)
	}) {
		h.t.Fatalf("run %s: timed out after %v waiting for %s; last record: %v (err %v)", id, runtest.Patience, what, last, lastErr)
	}
	return last
}

// waitRunning waits until the run is running with its pid recorded.
func (h *harness) waitRunning(id string) record {
	h.t.Helper()
	return h.waitState(id, "state running", func(r record) bool {
		return r.State == "running" && r.PID > 0 && r.PGID > 0
	})
}

// waitTerminal waits until the run's record is terminal.
func (h *harness) waitTerminal(id string) record {
	h.t.Helper()
	return h.waitState(id, "a terminal state", record.terminal)
}

// wantFinal checks a terminal record's state, cause (unless "") and exit
// code, and that it promises no survivors.
func wantFinal(t *testing.T, r record, state, cause string, code int) {
	t.Helper()
	if r.State != state || cause != "" && r.Cause != cause || r.ExitCode == nil || *r.ExitCode != code {
		t.Errorf("final record: %v; want state=%s cause=%s exit_code=%d", r, state, cause, code)
	}
	if r.Survivors == nil || len(r.Survivors) != 0 {
		t.Errorf("final record: survivors = %v, want an empty list", r.Survivors)
	}
}

// events returns the event names of the run's journal, in order.
func (h *harness) events(id string) []string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, id, "events.jsonl"))
	if err != nil {
		h.t.Fatalf("reading journal: %v", err)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev struct {
			Event string `json:"event"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			h.t.Fatalf("journal line %q: %v", line, err)
		}
		names = append(names, ev.Event)
	}
	return names
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// reconcileJSON runs `reconcile --json id` over a new connection and returns
// its exit code and the decoded verdict.
func (h *harness) reconcileJSON(id string) (int, map[string]any) {
	h.t.Helper()
	r := h.ssh("reconcile", "--json", id)
	var v map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &v); err != nil {
		h.t.Fatalf("reconcile --json %s: exit %d, output %q: %v\nstderr: %s", id, r.code, r.stdout, err, r.stderr)
	}
	return r.code, v
}

// killRuns kills, by recorded and verified PIDs, whatever the test's runs
// left alive (runtest.KillRuns). It reports nothing: the tests judge; this
// only keeps a failing test from leaking processes.
func (h *harness) killRuns() { runtest.KillRuns(h.root) }

func readInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
