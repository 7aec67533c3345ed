package transport

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/answer"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// The host's real `renew --json` output decodes into answer.Renew, one
// line per run: a live run renewed (state running, a deadline ahead), a
// finished run refused (state finished), an unknown ID without a run. The
// controller's batch (lead, over a local shell standing in for ssh) reads
// the same output into each run's spool answer: renewed with the batch's
// size, refused with the host's reason, no run, and the spool answer's
// bytes are the fields it always had; a run alone renews the same way.
func TestRenewAnswerRoundTrip(t *testing.T) {
	root := runtest.NewRoot(t)
	runtest.LiveAndFinished(t, root, "live1", "done1")

	before := time.Now().Unix()
	code, out, errs := runtest.Exec(t, root, "renew", "--json", "--lease", "90s", "live1", "done1", "nosuch")
	if code != exitcode.Failure {
		t.Fatalf("renew --json: exit %d, want %d (not every run renewed)\n%s%s", code, exitcode.Failure, out, errs)
	}
	got := answer.ParseRenew([]byte(out))
	if len(got) != 3 {
		t.Fatalf("renew --json: %d answers, want 3\n%s", len(got), out)
	}
	if a := got["live1"]; !a.Renewed || a.Refused || a.NoRun || a.State != statusfile.Running || a.Deadline < before+90 || a.Reason != "" {
		t.Errorf("live1: %+v, want renewed, running, deadline >= %d", a, before+90)
	}
	if a := got["done1"]; a.Renewed || !a.Refused || a.NoRun || a.State != statusfile.Finished || a.Deadline != 0 || a.Reason == "" {
		t.Errorf("done1: %+v, want refused, finished, with a reason", a)
	}
	if a := got["nosuch"]; a.Renewed || a.Refused || !a.NoRun || a.State != "" || a.Reason == "" {
		t.Errorf("nosuch: %+v, want no run, with a reason", a)
	}

	// The controller's batch: the three wants posted, one leader's session.
	rsh := []string{"sh", "-c", `exec sh -c "$2"`, "localsh"}
	h, err := NewHost(rsh, "somehost", runtest.Binary(t), root, t.TempDir(), "rt")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	b := newRenewBatch(t.TempDir(), h)
	ids := []string{"live1", "done1", "nosuch"}
	for _, d := range []string{b.dir, filepath.Join(b.dir, "want"), filepath.Join(b.dir, "ans")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		w, err := b.post(filepath.Join(b.dir, "want", id))
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), runtest.Patience)
	defer cancel()
	b.lead(ctx)
	spool := map[string]string{}
	ans := map[string]BatchAnswer{}
	for _, id := range ids {
		p := filepath.Join(b.dir, "ans", id)
		bs, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("no spool answer for %s: %v", id, err)
		}
		spool[id] = string(bs)
		a, ok := readAnswer(p)
		if !ok {
			t.Fatalf("spool answer for %s does not decode: %s", id, bs)
		}
		ans[id] = a
	}
	if a := ans["live1"]; !a.Renewed || a.Batch != 3 || a.Lost != "" || a.Single {
		t.Errorf("live1: %+v, want renewed in a batch of 3", a)
	}
	if s, want := spool["live1"], `{"run_id":"live1","renewed":true,"batch":3}`; s != want {
		t.Errorf("live1's spool answer:\n got %s\nwant %s", s, want)
	}
	if a := ans["done1"]; a.Renewed || !a.Refused || a.Reason != got["done1"].Reason || a.Batch != 3 {
		t.Errorf("done1: %+v, want refused (%q) in a batch of 3", a, got["done1"].Reason)
	}
	if s, want := spool["done1"], `{"run_id":"done1","renewed":false,"refused":true,"reason":"renewal refused: run done1 is finished","batch":3}`; s != want {
		t.Errorf("done1's spool answer:\n got %s\nwant %s", s, want)
	}
	if a := ans["nosuch"]; a.Renewed || !a.NoRun || a.Reason == "" || a.Batch != 3 {
		t.Errorf("nosuch: %+v, want no run in a batch of 3", a)
	}
	// The whole path of one run's renewal (post, lead, answer, read) when
	// it is alone at its tick.
	if a := b.renew(ctx, "live1", runtest.Patience); !a.Renewed || a.Batch != 1 || a.Lost != "" || a.Single {
		t.Errorf("renew live1 alone: %+v, want renewed in a batch of 1", a)
	}
	// The run renewed by the batch is renewed on the host: its journal has
	// the three renewals.
	n := 0
	for _, e := range (runtest.Run{Root: root, ID: "live1"}).Events(t) {
		if e == "lease_renewed" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("live1's journal has %d lease_renewed, want 3", n)
	}
	if code, out, errs := runtest.Exec(t, root, "cancel", "--wait", "30s", "live1"); code != 0 {
		t.Errorf("cancel live1: exit %d\n%s%s", code, out, errs)
	}
	runtest.Run{Root: root, ID: "live1"}.AssertGroupEmpty(t)
}
