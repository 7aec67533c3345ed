//go:build linux

package cli_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// startFed starts `run --detach --stdin pipe ID -- argv` and returns its
// record (with the control socket).
func startFed(t *testing.T, root, id string, argv ...string) (runtest.Run, *statusfile.Record) {
	t.Helper()
	r, rec := startDetached(t, root, id, []string{"--stdin", "pipe"}, argv...)
	if rec.ControlSocket == "" {
		t.Fatalf("record %+v: no control socket", rec)
	}
	return r, rec
}

// startDetached starts `run --detach FLAGS --lease 60s --grace 1s ID --
// argv` (its group killed at cleanup) and returns the record it printed.
func startDetached(t *testing.T, root, id string, flags []string, argv ...string) (runtest.Run, *statusfile.Record) {
	t.Helper()
	r := runtest.Run{Root: root, ID: id}
	cleanupRun(t, r)
	args := append(append(append([]string{"run", "--detach"}, flags...), "--lease", "60s", "--grace", "1s", id, "--"), argv...)
	code, out, errOut := runtest.Exec(t, root, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	rec, err := statusfile.Parse([]byte(out))
	if err != nil {
		t.Fatalf("record %q: %v", out, err)
	}
	return r, rec
}

func dialStdin(t *testing.T, rec *statusfile.Record, from int64) (net.Conn, handoff.Reply) {
	t.Helper()
	c, rep, err := handoff.DialStdin(rec.ControlSocket, rec.RunID, from)
	if err != nil {
		t.Fatalf("stdin feeder from %d: %v", from, err)
	}
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, rep
}

// stdinClosed returns the fields of the journal's stdin_closed, or nil.
func stdinClosed(t *testing.T, r runtest.Run) map[string]any {
	for _, e := range r.Journal(t) {
		if e.Event == "stdin_closed" {
			return e.Fields
		}
	}
	return nil
}

// A feeder replaced by another mid-stream: the second, sending again from
// byte 0, is told the job has 3 bytes, the wrapper skips them, and the job
// reads every byte once, then end of file at the EOF frame. The first
// feeder's connection is closed by the wrapper.
func TestStdinFeederResumes(t *testing.T) {
	root := runtest.NewRoot(t)
	out := filepath.Join(t.TempDir(), "got")
	r, rec := startFed(t, root, "fed1", "sh", "-c", `cat > "$1"`, "sh", out)

	// A start before the stream's first byte would skip bytes the job
	// never had: refused, and the run goes on.
	if c, rep := dialStdin(t, rec, -1); c != nil || rep.OK || rep.Reason != "malformed" {
		t.Fatalf("feeder from -1: %+v, want refused malformed", rep)
	}
	a, rep := dialStdin(t, rec, 0)
	if !rep.OK || rep.Written != 0 || rep.Closed != "" {
		t.Fatalf("first feeder: %+v, want ok from 0", rep)
	}
	if err := handoff.WriteData(a, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the job to have abc", func() bool {
		b, _ := os.ReadFile(out)
		return string(b) == "abc"
	})

	b, rep := dialStdin(t, rec, 0)
	if !rep.OK || rep.Written != 3 {
		t.Fatalf("second feeder: %+v, want ok, written 3", rep)
	}
	// The first is gone: its connection reads end of file.
	if n, err := io.Copy(io.Discard, a); n != 0 || err != nil {
		t.Errorf("the replaced feeder's connection: %d bytes, %v; want closed", n, err)
	}
	if err := handoff.WriteData(b, []byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	if err := handoff.WriteEOF(b); err != nil {
		t.Fatal(err)
	}
	final := r.WaitState(t, statusfile.Finished)
	if final.ExitCode == nil || *final.ExitCode != 0 {
		t.Errorf("final %+v, want finished 0", final)
	}
	if got, _ := os.ReadFile(out); string(got) != "abcdef" {
		t.Errorf("the job read %q, want %q", got, "abcdef")
	}
	if f := stdinClosed(t, r); f == nil || f["reason"] != "eof" || f["written"] != float64(6) {
		t.Errorf("journal stdin_closed: %v, want reason eof, written 6", f)
	}
	r.AssertGroupEmpty(t)
}

// A feeder that would start past what the job was given is refused, and
// the run is cancelled with cause stdin_lost (143) before the job reads a
// byte after the hole.
func TestStdinGapCancels(t *testing.T) {
	root := runtest.NewRoot(t)
	out := filepath.Join(t.TempDir(), "got")
	r, rec := startFed(t, root, "fed2", "sh", "-c", `cat > "$1"`, "sh", out)
	a, rep := dialStdin(t, rec, 0)
	if err := handoff.WriteData(a, []byte("abc")); err != nil || !rep.OK {
		t.Fatalf("first feeder: %+v, %v", rep, err)
	}
	runtest.Eventually(t, "the job to have abc", func() bool {
		b, _ := os.ReadFile(out)
		return string(b) == "abc"
	})
	c, rep := dialStdin(t, rec, 5)
	if c != nil || rep.OK || rep.Reason != handoff.ReasonStdinGap || rep.Written != 3 {
		t.Fatalf("feeder from 5: %+v, want refused stdin_gap, written 3", rep)
	}
	final := r.WaitState(t, statusfile.Cancelled)
	if final.Cause != statusfile.CauseStdinLost || final.ExitCode == nil || *final.ExitCode != 143 {
		t.Errorf("final %+v, want cancelled stdin_lost 143", final)
	}
	if got, _ := os.ReadFile(out); string(got) != "abc" {
		t.Errorf("the job read %q, want %q", got, "abc")
	}
	found := false
	for _, e := range r.Journal(t) {
		if e.Event == "cancel_requested" && e.Fields["cause"] == "stdin_lost" {
			found = e.Fields["stdin_from"] == float64(5) && e.Fields["stdin_written"] == float64(3)
		}
	}
	if !found {
		t.Errorf("no cancel_requested with cause stdin_lost, stdin_from 5, stdin_written 3 in %v", r.Events(t))
	}
	r.AssertGroupEmpty(t)
}

// A job that closes its stdin ends the stream: the bytes after it have
// nowhere to go, the journal says reader_gone, and a later feeder is told
// the stream is closed (no gap is possible, however far it starts).
func TestStdinReaderGone(t *testing.T) {
	root := runtest.NewRoot(t)
	r, rec := startFed(t, root, "fed3", "sh", "-c", `head -c 2 >/dev/null; exec 0<&-; echo closed; exec sleep 300`)
	a, _ := dialStdin(t, rec, 0)
	if err := handoff.WriteData(a, bytes.Repeat([]byte("x"), 1<<20)); err != nil {
		t.Logf("writing after the job closed its stdin: %v", err) // the wrapper may close first
	}
	runtest.Eventually(t, "stdin_closed", func() bool { return stdinClosed(t, r) != nil })
	if f := stdinClosed(t, r); f["reason"] != "reader_gone" {
		t.Errorf("journal stdin_closed: %v, want reason reader_gone", f)
	}
	c, rep := dialStdin(t, rec, 1<<30)
	if c == nil || !rep.OK || rep.Closed != handoff.StdinReaderGone {
		t.Errorf("a later feeder: %+v, want ok, closed reader_gone", rep)
	}
	if st := r.MustStatus(t); st.State != statusfile.Running {
		t.Errorf("the run is %s, want running: a stdin the job closed is no loss", st.State)
	}
}

// A run whose stdin is not a fed pipe refuses a feeder (no_stdin) and
// goes on.
func TestStdinNotFed(t *testing.T) {
	root := runtest.NewRoot(t)
	r, rec := startDetached(t, root, "fed4", nil, "sleep", "300")
	c, rep := dialStdin(t, rec, 0)
	if c != nil || rep.OK || rep.Reason != handoff.ReasonNoStdin {
		t.Errorf("feeder of a run without --stdin pipe: %+v, want refused no_stdin", rep)
	}
	if st := r.MustStatus(t); st.State != statusfile.Running {
		t.Errorf("the run is %s, want running", st.State)
	}
}
