//go:build linux

package cli_test

import (
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

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

func aw(t *testing.T, root string, args ...string) (int, string, string) {
	t.Helper()
	return runtest.Exec(t, root, args...)
}

func seqOf(es []journal.Entry, event string) int64 {
	for _, e := range es {
		if e.Event == event {
			return e.Seq
		}
	}
	return -1
}

// endLease ends a run's lease on demand (renew --lease 1s) and returns the
// new deadline: tests start runs with a long lease and end it when their
// checks are made, instead of racing a short lease.
func endLease(t *testing.T, root string, r runtest.Run) time.Time {
	t.Helper()
	if code, _, stderr := aw(t, root, "renew", "--lease", "1s", r.ID); code != 0 {
		t.Fatalf("renew --lease 1s %s: exit %d: %s", r.ID, code, stderr)
	}
	return time.Unix(deadlineOf(t, r), 0)
}

// expireLease ends r's lease (endLease) and waits until its deadline has
// passed.
func expireLease(t *testing.T, root string, r runtest.Run) {
	t.Helper()
	dl := endLease(t, root, r)
	runtest.Eventually(t, "the deadline to pass", func() bool { return time.Now().After(dl) })
}

func deadlineOf(t *testing.T, r runtest.Run) int64 {
	t.Helper()
	dl, err := strconv.ParseInt(strings.TrimSpace(r.File("deadline_epoch")), 10, 64)
	if err != nil {
		t.Fatalf("run %s: deadline_epoch: %v", r.ID, err)
	}
	return dl
}

// A leased run lives on while it is renewed, each renewal moving the
// deadline on; a renewal that ends the lease (renew --lease 1s) has the
// wrapper stop it within that lease, plus the second the wrapper takes to
// see a deadline moved closer, plus 2 s (cause lease, exit 124); and a
// renewal afterwards is refused while the job stays dead.
func TestLeaseRenewThenExpire(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "l1", "--lease", "5m", "l1", "--", "sh", "-c", "sleep 300 & wait")
	rec := r.WaitState(t, statusfile.Running)
	prev := deadlineOf(t, r)
	for i := 0; i < 3; i++ {
		if code, _, stderr := aw(t, root, "renew", "l1"); code != 0 {
			t.Fatalf("renew: exit %d: %s", code, stderr)
		}
		if dl := deadlineOf(t, r); dl < prev {
			t.Fatalf("renewal %d moved the deadline back: %d, was %d", i+1, dl, prev)
		} else {
			prev = dl
		}
	}
	if c.Exited() || !proc.Alive(rec.PID, 0) {
		t.Fatalf("run stopped although renewed: %v", r.Status())
	}
	if seqOf(r.Journal(t), "lease_renewed") < 0 {
		t.Fatalf("no lease_renewed in the journal: %v", r.Events(t))
	}
	endLease(t, root, r)
	stopped := time.Now()
	code := c.Wait(t)
	took := time.Since(stopped)
	if code != 124 {
		t.Fatalf("exit %d, want 124\n%s", code, c.Stderr.String())
	}
	// lease 1s, rounded up to a whole second; the wrapper's look at the
	// deadline, once a second; + 2s
	if limit := 2*time.Second + time.Second + 2*time.Second; took > limit {
		t.Errorf("stopped %v after the renewal that ended the lease, want within %v", took, limit)
	}
	r.AssertGroupEmpty(t)
	rec = r.MustStatus(t)
	if rec.State != statusfile.Cancelled || rec.Cause != statusfile.CauseLease || rec.Code() != 124 {
		t.Fatalf("state %s cause %s code %d", rec.State, rec.Cause, rec.Code())
	}
	es := r.Journal(t)
	if exp, sig := seqOf(es, "deadline_expired"), seqOf(es, "signal_sent"); exp < 0 || exp > sig {
		t.Fatalf("deadline_expired (%d) must precede signal_sent (%d)", exp, sig)
	}
	code, _, stderr := aw(t, root, "renew", "l1")
	if code != 1 || !strings.Contains(stderr, "cancelled") {
		t.Fatalf("renew after expiry: exit %d: %s", code, stderr)
	}
	r.AssertGroupEmpty(t)
}

// Simulated PID reuse: a run's pid, pgid and record point at an unrelated
// live process of the same user in its own session. cancel and watchdog
// leave it (and its child) alive and say why.
func TestPIDReuseLeftAlone(t *testing.T) {
	root := runtest.NewRoot(t)
	// The unrelated process: its own session, with a child in its group.
	other := exec.Command("setsid", "sh", "-c", "sleep 300 & wait")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Kill(-other.Process.Pid, unix.SIGKILL)
		other.Wait()
	})
	var st proc.Stat
	runtest.Eventually(t, "the unrelated process in its own session with a child", func() bool {
		var err error
		st, err = proc.ReadStat(other.Process.Pid)
		return err == nil && st.SID == st.PID && len(runtest.Members(st.PID)) == 2
	})
	before := runtest.Members(st.PID)
	boot, _ := proc.BootID()
	// A finished wrapper: a process that has exited and been reaped.
	gone := exec.Command("true")
	gone.Run()
	for _, id := range []string{"reused1", "reused2"} {
		dir := filepath.Join(root, id)
		os.MkdirAll(dir, 0o700)
		os.Chmod(root, 0o700)
		rec := &statusfile.Record{Schema: 1, RunID: id, State: statusfile.Running, PID: st.PID, PGID: st.PID, SID: st.PID,
			LeaderStart: st.Start - 1, // the recorded leader started earlier: this is another process
			WrapperPID:  gone.Process.Pid, WrapperStart: 1, BootID: boot, Command: []string{"sleep", "300"},
			CreatedAt: statusfile.Timestamp(time.Now()), LeaseSeconds: 1, GraceSeconds: 1}
		b, _ := statusfile.Marshal(rec)
		os.WriteFile(filepath.Join(dir, "status.json"), b, 0o600)
		os.WriteFile(filepath.Join(dir, "pid"), []byte(fmt.Sprintf("%d\n", st.PID)), 0o600)
		os.WriteFile(filepath.Join(dir, "pgid"), []byte(fmt.Sprintf("%d\n", st.PID)), 0o600)
		os.WriteFile(filepath.Join(dir, "deadline_epoch"), lease.FormatDeadline(time.Now().Add(-time.Minute).Unix()), 0o600)
	}
	_, _, stderr := aw(t, root, "cancel", "reused1")
	if !strings.Contains(stderr, "PID reused") {
		t.Errorf("cancel did not say why it left pid %d alone: %s", st.PID, stderr)
	}
	code, out, _ := aw(t, root, "watchdog", "--once")
	if code != 0 || !strings.Contains(out, "PID reused") {
		t.Errorf("watchdog did not say why it left pid %d alone: exit %d %s", st.PID, code, out)
	}
	for _, p := range before {
		if !proc.Alive(p.PID, p.Start) {
			t.Fatalf("unrelated process %d was killed", p.PID)
		}
	}
	for _, id := range []string{"reused1", "reused2"} {
		r := runtest.Run{Root: root, ID: id}
		found := false
		for _, e := range r.Journal(t) {
			found = found || e.Event == "signal_refused"
			if e.Event == "signal_sent" {
				t.Fatalf("%s: a signal was sent: %v", id, e.Fields)
			}
		}
		if !found {
			t.Errorf("%s: no signal_refused in the journal: %v", id, r.Events(t))
		}
	}
}

// 50 renewals racing a watchdog loop across the deadline: no renewal
// succeeds after deadline_expired is journaled, and every renewal that
// reported success is in the journal.
func TestRenewRacesWatchdog(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	// the watchdog, not the wrapper, must expire it
	r, _ := orphanWith(t, root, "race", []string{"--grace", "1s"}, 0, "sleep", "300")
	wd := runtest.Start(t, root, "watchdog", "--interval", "0.05s")
	t.Cleanup(func() { wd.Process.Signal(unix.SIGTERM); wd.Wait(t) })

	bin := runtest.Binary(t)
	var mu sync.Mutex
	ok := 0
	renew := func() {
		cmd := exec.Command(bin, "--root", root, "renew", "--lease", "1s", "race")
		if cmd.Run() == nil {
			mu.Lock()
			ok++
			mu.Unlock()
		}
	}
	// 25 renewals of 1 s (the first ends the long lease the run started
	// with) keep the lease alive; then they stop until just before the
	// deadline they left, and 25 more arrive concurrently across it, racing
	// the watchdog's expiry. Whichever wins each time, the journal must show
	// every success and none after the expiry.
	for i := 0; i < 25; i++ {
		renew()
	}
	dl, _ := strconv.ParseInt(strings.TrimSpace(r.File("deadline_epoch")), 10, 64)
	for time.Until(time.Unix(dl, 0)) > 50*time.Millisecond {
		time.Sleep(time.Until(time.Unix(dl, 0)) - 50*time.Millisecond)
	}
	var wg sync.WaitGroup
	for i := 0; i < 25; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 20 * time.Millisecond)
			renew()
		}()
	}
	wg.Wait()
	runtest.Eventually(t, "the watchdog to stop the run", func() bool {
		s := r.Status()
		return s != nil && statusfile.Terminal(s.State)
	})
	r.AssertGroupEmpty(t)
	es := r.Journal(t)
	exp := seqOf(es, "deadline_expired")
	if exp < 0 {
		t.Fatalf("no deadline_expired: %v", r.Events(t))
	}
	renewed := 0
	for _, e := range es {
		if e.Event == "lease_renewed" {
			renewed++
			if e.Seq > exp {
				t.Fatalf("lease_renewed at seq %d after deadline_expired at %d", e.Seq, exp)
			}
		}
	}
	if renewed != ok {
		t.Fatalf("%d renewals reported success, %d journaled", ok, renewed)
	}
	t.Logf("%d of 50 renewals succeeded before the expiry", ok)
}

// watchdog --once over a root with a corrupt status.json (and no journal to
// rebuild it from) and a run whose deadline file is missing: exit 0, the
// corrupt run reported, the other left to its journal's deadline, and the
// healthy expired run is still stopped.
func TestWatchdogSkipsBrokenRuns(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	r, _ := orphanWith(t, root, "healthy", []string{"--grace", "1s"}, 0, "sleep", "300")
	r2, rec2 := orphanWith(t, root, "nodeadline", nil, 0, "sleep", "300")
	os.Remove(filepath.Join(r2.Dir(), "deadline_epoch"))
	bad := filepath.Join(root, "corrupt")
	os.Mkdir(bad, 0o700)
	os.WriteFile(filepath.Join(bad, "status.json"), []byte(`{"schema":1,"run_id":"corr`), 0o600)
	os.WriteFile(filepath.Join(bad, "deadline_epoch"), []byte("1\n"), 0o600)

	expireLease(t, root, r)
	code, out, stderr := aw(t, root, "watchdog", "--once")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	acts := map[string]watchdog.Action{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var a watchdog.Action
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		acts[a.RunID] = a
	}
	if _, seen := acts["nodeadline"]; acts["healthy"].Action != "stopped" || acts["corrupt"].Action != "skipped" || seen {
		t.Fatalf("actions: %s", out)
	}
	r.AssertGroupEmpty(t)
	// The run without a deadline file is left running: its deadline is the
	// journal's, five minutes away.
	if len(runtest.Members(rec2.PGID)) != 1 {
		t.Fatal("the run with no deadline file was touched")
	}
}
