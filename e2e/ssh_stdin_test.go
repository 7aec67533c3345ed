package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
)

// The job's stdin through `agent-wrap ssh`: the controller's own, byte for
// byte, end of file included, across reattaches; -n gives /dev/null; a
// stream that can no longer be resumed cancels the run (stdin_lost).

// randomBytes returns n bytes from crypto/rand.
func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// 5 MiB of random bytes reach the job whole: its sha256sum of its stdin is
// the digest of what the controller read. Through agent-wrap's
// ControlMasters (the launch's stdin behind the launch gate) and with a
// connection per call (the launch's stdin a pipe of its own).
func TestSSHStdinDigest(t *testing.T) {
	t.Parallel()
	for _, mux := range []string{"auto", "off"} {
		t.Run("mux-"+mux, func(t *testing.T) {
			t.Parallel()
			c := newCtlHarness(t)
			id := "stdin-digest-" + mux
			in := randomBytes(t, 5<<20)
			flags := append([]string{"--mux", mux}, longLease...)
			k := startCtlIn(t, c.env, c.sshArgs(c.srv.Destination(), id, flags, "sha256sum"), bytes.NewReader(in))
			if code := k.wait(t); code != 0 {
				t.Fatalf("controller exit %d, want 0\nstderr: %s", code, k.stderr())
			}
			if got, want := k.stdout(), sha256Hex(in)+"  -\n"; got != want {
				t.Errorf("the job's digest of its stdin: %q, want %q", got, want)
			}
			if k.stderr() != "" {
				t.Errorf("a clean run said something: %q", k.stderr())
			}
			c.wantSettled(id, "completed", "", 0)
			c.treeGone(id)
		})
	}
}

// An empty stdin is an immediate end of file for the job: cat returns.
func TestSSHStdinImmediateEOF(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := startCtlIn(t, c.env, c.sshArgs(c.srv.Destination(), "stdin-eof", longLease, "sh", "-c", `cat; echo "eof seen"`), strings.NewReader(""))
	if code := k.wait(t); code != 0 {
		t.Fatalf("controller exit %d, want 0\nstderr: %s", code, k.stderr())
	}
	if got := k.stdout(); got != "eof seen\n" {
		t.Errorf("stdout %q, want %q", got, "eof seen\n")
	}
	if ev := c.harness.events("stdin-eof"); !contains(ev, "stdin_closed") {
		t.Errorf("the host's journal has no stdin_closed: %v", ev)
	}
	c.treeGone("stdin-eof")
}

// -n: the job's stdin is /dev/null on the host, and the controller's stdin
// is not read.
func TestSSHStdinNull(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := startCtlIn(t, c.env, c.sshArgs(c.srv.Destination(), "stdin-null", append([]string{"-n"}, longLease...),
		"sh", "-c", `readlink /proc/self/fd/0; cat; echo end`), strings.NewReader("not for the job\n"))
	if code := k.wait(t); code != 0 {
		t.Fatalf("controller exit %d, want 0\nstderr: %s", code, k.stderr())
	}
	if got, want := k.stdout(), "/dev/null\nend\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	c.treeGone("stdin-null")
}

// The launch connection is cut by the relay while the job holds part of
// the stream unread: the controller reattaches, sends again from the
// oldest byte it kept, and the job gets every byte once.
func TestSSHStdinCutMidStream(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	dir := t.TempDir()
	in := randomBytes(t, 5<<20)
	// The job takes the first MiB, says so, and takes the rest only once
	// the test has cut the connection.
	job := []string{"sh", "-c", `head -c 1048576 > "$1/a" && echo half && while [ ! -e "$1/go" ]; do sleep 0.05; done && cat > "$1/b"`, "sh", dir}
	k := startCtlIn(t, c.env, c.sshArgs(c.srv.Destination(), "stdin-cut", longLease, job...), bytes.NewReader(in))
	runtest.Eventually(t, "half", func() bool { return strings.Contains(k.stdout(), "half\n") })
	c.rl.Cut()
	c.waitEvent("stdin-cut", "detached", 0)
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := k.wait(t); code != 0 {
		t.Fatalf("controller exit %d, want 0\nstderr: %s", code, k.stderr())
	}
	a, _ := os.ReadFile(filepath.Join(dir, "a"))
	b, _ := os.ReadFile(filepath.Join(dir, "b"))
	got := append(a, b...)
	if len(got) != len(in) || sha256Hex(got) != sha256Hex(in) {
		t.Errorf("the job read %d bytes (sha256 %s), the controller was given %d (sha256 %s)", len(got), sha256Hex(got), len(in), sha256Hex(in))
	}
	if ev := c.ctlEvents("stdin-cut"); !contains(ev, "attached") {
		t.Errorf("no reattach in the controller's events: %v", ev)
	}
	c.wantSettled("stdin-cut", "completed", "", 0)
	c.treeGone("stdin-cut")
}

// countingReader counts what the controller has taken of its stdin.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A job that does not read while far more than the bound (64 KiB here)
// was sent, then the connection is cut: the bytes the host never took are
// no longer kept, so the stream cannot be resumed without a hole, and the
// run is cancelled with cause stdin_lost.
func TestSSHStdinPastBoundCut(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	c.env = append(c.env, "AGENT_WRAP_STDIN_KEEP=64K")
	in := &countingReader{r: bytes.NewReader(randomBytes(t, 16<<20))}
	k := startCtlIn(t, c.env, c.sshArgs(c.srv.Destination(), "stdin-bound", longLease, "sh", "-c", "echo ready; exec sleep 300"), in)
	runtest.Eventually(t, "ready", func() bool { return strings.Contains(k.stdout(), "ready\n") })
	// 1 MiB taken by the controller: at most 64 KiB of it waits in the
	// pipe to it and 128 KiB in what it keeps, so it has sent far more
	// than the 64 KiB the job's pipe holds.
	runtest.Eventually(t, "the controller to take 1 MiB of its stdin", func() bool { return in.n.Load() >= 1<<20 })
	c.rl.Cut()
	if code := k.wait(t); code != 143 {
		t.Fatalf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	wantFinal(t, c.waitTerminal("stdin-bound"), "cancelled", "stdin_lost", 143)
	c.wantSettled("stdin-bound", "cancelled", "stdin_lost", 143)
	c.treeGone("stdin-bound")
}

// `agent-wrap ssh HOST -- seq 1 10000000 | head -2`: the ledger says what
// reached the controller's stdout, not what the job wrote, and that its
// reader went away; the run is cancelled, as ssh's SIGPIPE would end it.
// (The job sleeps after its output, so that the cancel finds it running:
// a job whose output all went to the host's log before the cancel arrived
// has finished, and its own outcome stands.)
func TestSSHOutputReaderGone(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	const id = "reader-gone"
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, c.sshArgs(c.srv.Destination(), id, append([]string{"-n"}, longLease...), "sh", "-c", "seq 1 1000000; exec sleep 300")...)
	cmd.Env = append(os.Environ(), "AGENT_WRAP_MUX_DIR="+muxDirFor(t))
	cmd.Stdout = pw
	var errb bytes.Buffer
	cmd.Stderr = &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	done := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	// head -2: two lines, then the reader goes away.
	br := bufio.NewReader(pr)
	for i := 1; i <= 2; i++ {
		line, err := br.ReadString('\n')
		if err != nil || line != string(rune('0'+i))+"\n" {
			t.Fatalf("line %d: %q, %v", i, line, err)
		}
	}
	pr.Close()
	select {
	case <-done:
	case <-time.After(2 * waitLong):
		t.Fatalf("controller still running\nstderr: %s", errb.String())
	}
	if code := exitCode(werr); code != 143 {
		t.Errorf("controller exit %d, want 143 (the run cancelled)\nstderr: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "went away") {
		t.Errorf("the controller did not say its reader went away: %q", errb.String())
	}
	r := c.ledgerRec(id)
	// What reached the pipe: the two lines and at most what the pipe and
	// the test's read buffer held, never the job's 6888896 bytes.
	if !r.StdoutClosed || r.StdoutBytes < 4 || r.StdoutBytes > 4096+65536 {
		t.Errorf("ledger: stdout_closed=%v stdout_bytes=%d; want closed and between 4 and %d", r.StdoutClosed, r.StdoutBytes, 4096+65536)
	}
	c.wantSettled(id, "cancelled", "cancel", 143)
	found := false
	b, _ := os.ReadFile(c.events)
	for _, line := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["event"] == "output_closed" {
			found = m["stream"] == "stdout" && m["delivered"] == float64(r.StdoutBytes)
		}
	}
	if !found {
		t.Errorf("no output_closed event for stdout with delivered %d in %s", r.StdoutBytes, b)
	}
	c.treeGone(id)
}
