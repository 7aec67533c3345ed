//go:build linux

package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// detachJob writes 40 batches of 300 numbered lines, 50 ms apart (about
// 100 kB over two seconds or more), then exits 7.
const detachJob = `i=0; while [ $i -lt 40 ]; do seq -f "$i:%g" 1 300; i=$((i+1)); sleep 0.05; done; exit 7`

func detachJobOutput() []byte {
	var b bytes.Buffer
	for i := 0; i < 40; i++ {
		for n := 1; n <= 300; n++ {
			fmt.Fprintf(&b, "%d:%d\n", i, n)
		}
	}
	return b.Bytes()
}

// run --detach returns as soon as the run is running, with its record, while
// the job goes on under a supervisor in its own session with stdio on
// /dev/null; the job has exactly the caller's environment and fds 0-2. A
// reattaching controller's logs -f prints every byte and ends with the run;
// wait exits with the job's code; the same ID again is refused while live.
func TestDetachWaitLogsFollow(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	r := runtest.Run{Root: root, ID: "det"}
	cleanupRun(t, r)

	runtest.Binary(t) // built before the clock starts
	start := time.Now()
	code, out, errOut := runtest.Exec(t, root, "run", "--detach", "det", "--", "sh", "-c", detachJob)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", code, errOut)
	}
	rec, err := statusfile.Parse([]byte(out))
	if err != nil {
		t.Fatalf("run --detach did not print a record: %v\n%s", err, out)
	}
	if rec.State != statusfile.Running || rec.PID <= 1 || rec.RunID != "det" {
		t.Fatalf("record: state %s pid %d run_id %s", rec.State, rec.PID, rec.RunID)
	}
	t.Logf("run --detach returned after %v", took)
	// "Within a second or two": a few hundred milliseconds here; the bound
	// leaves room for a loaded machine, and the record being `running`
	// already shows it returned long before the job's end.
	if took > 5*time.Second {
		t.Errorf("run --detach took %v to return", took)
	}

	// Follow and wait while the job is still writing.
	logs := runtest.Start(t, root, "logs", "-f", "det")
	wait := runtest.Start(t, root, "wait", "det")

	// The supervisor: its own session, stdio on /dev/null.
	st, err := proc.ReadStat(rec.WrapperPID)
	if err != nil || st.SID != rec.WrapperPID {
		t.Errorf("supervisor %d: session %d (err %v), want its own", rec.WrapperPID, st.SID, err)
	}
	for fd := 0; fd <= 2; fd++ {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", rec.WrapperPID, fd)); l != os.DevNull {
			t.Errorf("supervisor fd %d is %q, want /dev/null", fd, l)
		}
	}
	// The job: fds 0-2 only, and the caller's environment with only
	// AGENT_WRAP_RUN_ID added (and SSH_AUTH_SOCK scoped, if the caller had one).
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", rec.PID)); err == nil {
		var fds []string
		for _, e := range ents {
			fds = append(fds, e.Name())
		}
		if strings.Join(fds, ",") != "0,1,2" {
			t.Errorf("job fds %v, want 0,1,2", fds)
		}
	} else if proc.Alive(rec.PID, 0) {
		t.Error(err)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", rec.PID)); err == nil {
		got := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		// What runtest.Start gave the caller, the ID and the run's control
		// socket (for an agent-wrap ssh in the job: a nested run).
		if rec.ControlSocket == "" {
			t.Error("the record names no control_socket")
		}
		want := append(os.Environ(), "AGENT_WRAP_ROOT="+root, "AGENT_WRAP_RUN_ID=det", "AGENT_WRAP_CONTROL="+rec.ControlSocket)
		noAgent := func(env []string) []string {
			return slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "SSH_AUTH_SOCK=") })
		}
		got, want = noAgent(got), noAgent(want)
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("job environment differs from the caller's:\n got %q\nwant %q", got, want)
		}
	}

	// The same ID while live: 75, never a second job.
	if code, _, errOut := runtest.Exec(t, root, "run", "--detach", "det", "--", "true"); code != 75 || !strings.Contains(errOut, "already running") {
		t.Errorf("same ID again: exit %d, stderr %q; want 75, already running", code, errOut)
	}

	if code := wait.Wait(t); code != 7 {
		t.Errorf("wait: exit %d, want 7\n%s", code, wait.Stderr.String())
	}
	if code := logs.Wait(t); code != 0 {
		t.Errorf("logs -f: exit %d, want 0\n%s", code, logs.Stderr.String())
	}
	want := detachJobOutput()
	if file := r.File("stdout.log"); file != string(want) {
		t.Errorf("stdout.log: %d bytes, want %d", len(file), len(want))
	}
	if got := logs.Stdout.Bytes(); !bytes.Equal(got, want) {
		t.Errorf("logs -f printed %d bytes, want the job's %d", len(got), len(want))
	}
	if rec := r.MustStatus(t); rec.State != statusfile.Finished || rec.Code() != 7 {
		t.Errorf("final record: state %s, code %d", rec.State, rec.Code())
	}
	r.AssertGroupEmpty(t)
	// And wait on a terminal run answers at once, as often as asked.
	if code, _, _ := runtest.Exec(t, root, "wait", "--timeout", "1s", "det"); code != 7 {
		t.Errorf("wait after the end: exit %d, want 7", code)
	}
}

// wait --timeout on a live run gives up with 75 and leaves it running; a
// cancel then ends it and wait returns the cancel's 143.
func TestWaitTimeoutThenCancel(t *testing.T) {
	root := runtest.NewRoot(t)
	r := runtest.Run{Root: root, ID: "slow"}
	cleanupRun(t, r)
	if code, _, errOut := runtest.Exec(t, root, "run", "--detach", "slow", "--", "sleep", "300"); code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", code, errOut)
	}
	code, _, errOut := runtest.Exec(t, root, "wait", "--timeout", "300ms", "slow")
	if code != 75 || !strings.Contains(errOut, "still running") {
		t.Fatalf("wait --timeout: exit %d, stderr %q; want 75, still running", code, errOut)
	}
	rec := r.MustStatus(t)
	if !proc.Alive(rec.PID, 0) {
		t.Fatal("wait --timeout must leave the run alone")
	}
	w := runtest.Start(t, root, "wait", "slow")
	if code, out, errOut := runtest.Exec(t, root, "cancel", "--wait", "20s", "slow"); code != 0 {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, errOut)
	}
	if code := w.Wait(t); code != 143 {
		t.Fatalf("wait: exit %d, want 143\n%s", code, w.Stderr.String())
	}
	r.AssertGroupEmpty(t)
}
