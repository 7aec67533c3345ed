package sshtest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

func TestEchoHi(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.Command(ctx, "echo", "hi").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh echo hi: %v\n%s\n%s", err, out, s.Log())
	}
	if string(out) != "hi\n" {
		t.Fatalf("ssh echo hi: got %q, want %q", out, "hi\n")
	}
	if s.Host() != "127.0.0.1" || s.Port() <= 0 || s.User() == "" {
		t.Fatalf("Host/Port/User = %q/%d/%q", s.Host(), s.Port(), s.User())
	}
}

// Cleanup stops the listener and the per-connection sshd of a connection
// that is still open, and waits for them.
func TestStoppedAfterCleanup(t *testing.T) {
	var listener process
	var conns []process
	var sshDone chan error
	closeStdin := func() {}
	t.Run("server", func(t *testing.T) {
		s := Start(t)
		listener = process{s.PID(), s.StartTime()}
		if !proc.Alive(listener.pid, listener.start) {
			t.Fatalf("sshd pid %d not alive while the server runs", listener.pid)
		}
		// An open connection: remote cat echoes what we send until EOF.
		cmd := s.Command(context.Background(), "cat")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(stdin, "ping")
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("remote cat: got %q, %v", line, err)
		}
		conns = childrenOf(listener.pid)
		if len(conns) == 0 {
			t.Fatalf("no per-connection sshd under pid %d while a connection is open", listener.pid)
		}
		sshDone = make(chan error, 1)
		go func() { sshDone <- cmd.Wait() }()
		// stdin stays open: the connection must be ended by the server's
		// cleanup, not by EOF.
		t.Cleanup(func() {
			if !proc.Alive(conns[0].pid, conns[0].start) {
				t.Errorf("connection ended before the server's cleanup ran")
			}
		})
		closeStdin = func() { stdin.Close() }
	})
	defer closeStdin()
	if sshDone == nil {
		// The server never started (no sshd here): there is nothing whose
		// cleanup could be checked. Start has already skipped or failed.
		t.Skip("the server did not start; see the server subtest")
	}
	if proc.Alive(listener.pid, listener.start) {
		t.Errorf("sshd pid %d still alive after cleanup", listener.pid)
	}
	for _, c := range conns {
		if proc.Alive(c.pid, c.start) {
			t.Errorf("per-connection sshd pid %d still alive after cleanup", c.pid)
		}
	}
	select {
	case <-sshDone:
	case <-time.After(30 * time.Second):
		t.Errorf("local ssh client still running 30s after the server stopped")
	}
}

// The remote environment: sshd's own PATH, not ours; env prefixes work;
// SetEnv works for AcceptEnv names only.
func TestRemoteEnvironment(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(opts []string, line string) string {
		t.Helper()
		out, err := s.CommandWith(ctx, opts, line).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh %v %q: %v\n%s", opts, line, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	t.Setenv("SSHTEST_LOCAL", "leak")
	if got := run(nil, `echo "[$SSHTEST_LOCAL]"`); got != "[]" {
		t.Errorf("local environment crossed: %q", got)
	}
	if got := run(nil, `env SSHTEST_A='a b' sh -c 'echo "$SSHTEST_A"'`); got != "a b" {
		t.Errorf("env prefix: got %q", got)
	}
	got := run([]string{"-o", "SetEnv=SSHTEST_B=bee AGENT_WRAP_ROOT=/tmp/r OTHER_VAR=x"},
		`echo "$SSHTEST_B|$AGENT_WRAP_ROOT|$OTHER_VAR"`)
	if got != "bee|/tmp/r|" {
		t.Errorf("SetEnv: got %q, want %q", got, "bee|/tmp/r|")
	}
	// The account's ~/.bashrc is not read (SHLVL=1 from sshd makes bash skip
	// it); PATH is sshd's compiled-in default: only logged.
	if got := run(nil, `echo "$SHLVL"`); got != "2" {
		t.Errorf("remote SHLVL = %q, want 2 (sshd's SetEnv SHLVL=1, plus bash's own level)", got)
	}
	t.Logf("remote PATH: %s", run(nil, `echo "$PATH"`))
}

func TestQuote(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{"plain", "two words", "it's", "$HOME", "", `back\slash`, "a;b|c&d", "*"}
	out, err := s.Command(ctx, "printf", `'<%s>\n'`, Quote(args...)).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh printf: %v\n%s", err, out)
	}
	var want strings.Builder
	for _, a := range args {
		want.WriteString("<" + a + ">\n")
	}
	if string(out) != want.String() {
		t.Fatalf("quoted args came back as\n%s\nwant\n%s", out, want.String())
	}
}

// fakeTB records Skipf and Fatalf and ends the goroutine as the real ones do.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestMissingSSHD(t *testing.T) {
	old := sshdPath
	sshdPath = "/nonexistent/sshd"
	t.Cleanup(func() { sshdPath = old })
	for _, tc := range []struct {
		ci       string
		wantSkip bool
	}{{"", true}, {"false", true}, {"true", false}} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			f := &fakeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Start(f)
			}()
			<-done
			msg := f.skipped + f.failed
			if tc.wantSkip && f.skipped == "" || !tc.wantSkip && f.failed == "" {
				t.Fatalf("skipped=%q failed=%q, want skip=%v", f.skipped, f.failed, tc.wantSkip)
			}
			if !strings.Contains(msg, "apt-get install openssh-server") {
				t.Errorf("message lacks the install hint: %q", msg)
			}
		})
	}
}

// On a machine without sshd, TestStoppedAfterCleanup skips at once (CI
// unset) with the install hint, rather than waiting on a server that never
// started. Re-run in a child test process with sshd's path pointed at
// nothing.
func TestStoppedAfterCleanupWithoutSSHD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStoppedAfterCleanup$", "-test.v")
	cmd.Env = append(os.Environ(), "SSHTEST_SSHD=/nonexistent/sshd", "CI=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil || took > 10*time.Second {
		t.Fatalf("TestStoppedAfterCleanup without sshd: %v after %v\n%s", err, took.Round(time.Millisecond), out)
	}
	for _, want := range []string{"--- SKIP: TestStoppedAfterCleanup", "apt-get install openssh-server"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
