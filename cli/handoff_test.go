//go:build linux

package cli_test

import (
	"os"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The control socket takes registrations only from processes of the run:
// a process outside it (this test) is refused, whether it gives its own
// PID or claims the job's; each refusal is an action of channel handoff in
// the journal, and no handoff is recorded. The socket is private and gone
// with the run. (The accepted path, through a real agent-wrap ssh inside a
// run, is e2e/nested_test.go.)
func TestControlSocketRefusesOutsiders(t *testing.T) {
	root := runtest.NewRoot(t)
	r, rec := startDetached(t, root, "ctl1", nil, "sleep", "300")
	if rec.ControlSocket == "" || rec.HandoffGraceSeconds != 1 {
		t.Fatalf("record: control_socket %q, handoff_grace_seconds %v; want a socket and the grace", rec.ControlSocket, rec.HandoffGraceSeconds)
	}
	st, err := os.Lstat(rec.ControlSocket)
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("control socket %s: %v, mode %v; want a socket, 0600", rec.ControlSocket, err, st.Mode())
	}

	self, err := proc.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	job, err := proc.ReadStat(rec.PID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		pid   int
		start uint64
	}{
		{"itself", self.PID, self.Start},
		{"claims-the-job", job.PID, job.Start},
	} {
		c, err := handoff.Dial(rec.ControlSocket)
		if err != nil {
			t.Fatalf("%s: dial: %v", tc.name, err)
		}
		rep, err := c.Ask(handoff.Request{Op: handoff.OpRegister, RunID: "inner", Outer: "ctl1", Dest: "b", PID: tc.pid, Start: tc.start}, 10*time.Second)
		c.Close()
		if err != nil || rep.OK || rep.Reason != "not_in_run" {
			t.Errorf("%s: register answered %+v, %v; want refused, not_in_run", tc.name, rep, err)
		}
	}
	refused := 0
	for _, e := range r.Journal(t) {
		switch {
		case e.Event == "handoff":
			t.Errorf("a refused registration was journaled as a handoff: %v", e.Fields)
		case e.Event == "action" && e.Fields["channel"] == "handoff" && e.Fields["decision"] == "refused":
			refused++
		}
	}
	// The first is refused by the gate (not a process of the run), the
	// second before it (not who it says it is); both are journaled.
	if refused != 2 {
		t.Errorf("journal: %d refused handoff actions, want 2", refused)
	}

	if code, _, errOut := runtest.Exec(t, root, "cancel", "--wait", "30s", "ctl1"); code != 0 {
		t.Fatalf("cancel: exit %d: %s", code, errOut)
	}
	if fin := r.MustStatus(t); len(fin.Handoffs) != 0 {
		t.Errorf("final record handoffs: %+v, want none", fin.Handoffs)
	}
	if _, err := os.Lstat(rec.ControlSocket); !os.IsNotExist(err) {
		t.Errorf("control socket still there after the run: %v", err)
	}
}
