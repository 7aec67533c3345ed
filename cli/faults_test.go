//go:build linux

package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

// These tests break what agent-wrap writes to (a full disk, a read-only
// root, a torn journal or record, a removed run directory, a writer killed
// at its rename) and check that the lease is still the last word: the job is
// stopped, and the record tells what happened.

// watchdogOnce runs watchdog --once and returns its actions by run ID.
func watchdogOnce(t *testing.T, root string) map[string]watchdog.Action {
	t.Helper()
	code, out, stderr := aw(t, root, "watchdog", "--once")
	if code != 0 {
		t.Fatalf("watchdog --once: exit %d: %s", code, stderr)
	}
	return parseActions(t, out)
}

func parseActions(t *testing.T, out string) map[string]watchdog.Action {
	t.Helper()
	acts := map[string]watchdog.Action{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var a watchdog.Action
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		acts[a.RunID] = a
	}
	return acts
}

// count counts a journal's events named event.
func count(es []journal.Entry, event string) int {
	n := 0
	for _, e := range es {
		if e.Event == event {
			n++
		}
	}
	return n
}

// startOrphan starts a leased run of job with a long lease, waits until it
// runs, and SIGKILLs its wrapper: what is left is the job alone.
func startOrphan(t *testing.T, root, id string, job ...string) (runtest.Run, *statusfile.Record) {
	t.Helper()
	return orphanWith(t, root, id, []string{"--grace", "1s", "--no-stream"}, 0, job...)
}

// orphanWith is startOrphan with run flags of its own after the long
// lease, and the job's processes to wait for (members, 0 for none) before
// its wrapper is killed.
func orphanWith(t *testing.T, root, id string, flags []string, members int, job ...string) (runtest.Run, *statusfile.Record) {
	t.Helper()
	args := append(append([]string{"--lease", "5m"}, flags...), id, "--")
	c, r := startRun(t, root, id, append(args, job...)...)
	rec := r.WaitState(t, statusfile.Running)
	if members > 0 {
		runtest.Eventually(t, "group populated", func() bool { return len(runtest.Members(rec.PGID)) == members })
	}
	killWrapper(t, c, rec)
	if len(runtest.GroupOf(rec.PGID, rec.LeaderStart)) == 0 {
		t.Fatal("the job did not outlive its wrapper")
	}
	return r, rec
}

// assertStopped fails unless every process of the run's group is gone.
func assertStopped(t *testing.T, rec *statusfile.Record) {
	t.Helper()
	if left := runtest.GroupOf(rec.PGID, rec.LeaderStart); len(left) > 0 {
		t.Fatalf("the job's group %d still runs: %v", rec.PGID, left)
	}
}

func full(t *testing.T, mnt string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail == 0
}

// A full disk at the claim: nothing is started, the run directory is
// removed and run exits 125 naming the full disk; once there is space the
// same ID runs.
func TestFullDiskAtClaimStartsNothing(t *testing.T) {
	mnt := runtest.Tmpfs(t, 1<<20)
	root := filepath.Join(mnt, "runs")
	if code, _, stderr := aw(t, root, "list"); code != 0 { // makes the root
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	filler := runtest.Fill(t, mnt)
	marker := filepath.Join(t.TempDir(), "ran")
	code, _, stderr := aw(t, root, "run", "claim1", "--", "touch", marker)
	if code != 125 {
		t.Fatalf("run on a full disk: exit %d, want 125\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "full") || !strings.Contains(stderr, "no space left") {
		t.Fatalf("the message does not name the full disk:\n%s", stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the job ran although its run could not be recorded")
	}
	if _, err := os.Lstat(filepath.Join(root, "claim1")); !os.IsNotExist(err) {
		t.Fatalf("the run directory was left behind (%v): the ID is used up", err)
	}
	// --detach: the supervisor's claim fails the same way, and its code
	// is the answer.
	code, _, stderr = aw(t, root, "run", "--detach", "claim2", "--", "touch", marker)
	if code != 125 || !strings.Contains(stderr, "full") {
		t.Fatalf("run --detach on a full disk: exit %d, want 125\n%s", code, stderr)
	}
	if _, err := os.Lstat(filepath.Join(root, "claim2")); !os.IsNotExist(err) {
		t.Fatalf("run --detach left its run directory (%v)", err)
	}
	os.Remove(filler)
	code, _, stderr = aw(t, root, "run", "claim1", "--", "touch", marker)
	if code != 0 {
		t.Fatalf("the same ID once there is space: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the job did not run the second time")
	}
}

// The job's own output fills the disk: the stop still happens, by the
// wrapper or, with the wrapper dead, by the watchdog, with its intent and
// final lines in the journal (space reserved at the claim) and the final
// record written (in place); a second watchdog pass adds no second intent.
func TestFullDiskMidRunStillStops(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	job := []string{"sh", "-c", "head -c 64M /dev/zero; exec sleep 300"}
	t.Run("wrapper", func(t *testing.T) {
		mnt := runtest.Tmpfs(t, 4<<20)
		root := filepath.Join(mnt, "runs")
		c, r := startRun(t, root, "fillw", append([]string{"--lease", "5m", "--grace", "1s", "--no-stream", "fillw", "--"}, job...)...)
		rec := r.WaitState(t, statusfile.Running)
		runtest.Eventually(t, "the job to fill the disk", func() bool { return full(t, mnt) })
		endLease(t, root, r)
		if code := c.Wait(t); code != 124 {
			t.Fatalf("exit %d, want 124\n%s", code, c.Stderr.String())
		}
		assertStopped(t, rec)
		got := r.MustStatus(t)
		if got.State != statusfile.Cancelled || got.Cause != statusfile.CauseLease || got.Code() != 124 {
			t.Fatalf("record: state %s cause %s code %d", got.State, got.Cause, got.Code())
		}
		es := r.Journal(t)
		if exp, sig, fin := seqOf(es, "deadline_expired"), seqOf(es, "signal_sent"), seqOf(es, "final"); exp < 0 || exp > sig || fin < sig {
			t.Fatalf("journal: deadline_expired %d, signal_sent %d, final %d: %v", exp, sig, fin, r.Events(t))
		}
		if code, out, stderr := aw(t, root, "verify", "fillw"); code != 0 {
			t.Fatalf("verify: exit %d %s %s", code, out, stderr)
		}
	})
	t.Run("watchdog", func(t *testing.T) {
		mnt := runtest.Tmpfs(t, 4<<20)
		root := filepath.Join(mnt, "runs")
		// The job fills the disk once told to, after the lease was
		// ended: the renewal is not what meets the full disk here, the
		// stop's record is.
		gate := filepath.Join(t.TempDir(), "go")
		r, rec := startOrphan(t, root, "fillwd", "sh", "-c", "while [ ! -e "+gate+" ]; do sleep 0.05; done; head -c 64M /dev/zero; exec sleep 300")
		dl := endLease(t, root, r)
		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		runtest.Eventually(t, "the job to fill the disk", func() bool { return full(t, mnt) })
		runtest.Eventually(t, "the deadline to pass", func() bool { return time.Now().After(dl) })
		acts := watchdogOnce(t, root)
		if a := acts["fillwd"]; a.Action != "stopped" {
			t.Fatalf("watchdog on a full disk: %+v", acts)
		}
		assertStopped(t, rec)
		got := r.MustStatus(t)
		if got.State != statusfile.Cancelled || got.Code() != 124 {
			t.Fatalf("record: state %s code %d (the journal and the record must tell one story)", got.State, got.Code())
		}
		// Passes after the stop find the run over: no intent appended again.
		for i := 0; i < 3; i++ {
			if acts := watchdogOnce(t, root); len(acts) != 0 {
				t.Fatalf("pass %d after the stop: %+v", i+2, acts)
			}
		}
		es := r.Journal(t)
		if n := count(es, "deadline_expired"); n != 1 {
			t.Fatalf("%d deadline_expired lines, want 1: %v", n, r.Events(t))
		}
		if n := count(es, "final"); n != 1 {
			t.Fatalf("%d final lines, want 1", n)
		}
	})
}

// A journal torn at its end (truncate -s -3) and the wrapper dead: the
// watchdog stops the run, recording the torn line with journal_torn, and
// verify names the torn line.
func TestTornJournalStillStops(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	r, rec := startOrphan(t, root, "torn", "sh", "-c", "sleep 300 & sleep 300 & wait")
	dl := endLease(t, root, r)
	events := filepath.Join(r.Dir(), "events.jsonl")
	fi, err := os.Stat(events)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(events, fi.Size()-3); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the deadline to pass", func() bool { return time.Now().After(dl) })
	acts := watchdogOnce(t, root)
	if a := acts["torn"]; a.Action != "stopped" {
		t.Fatalf("watchdog over a torn journal: %+v", acts)
	}
	assertStopped(t, rec)
	if got := r.MustStatus(t); got.State != statusfile.Cancelled || got.Code() != 124 {
		t.Fatalf("record: state %s code %d", got.State, got.Code())
	}
	f, err := os.Open(events)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es := journal.Evidence(f)
	if seqOf(es, "journal_torn") < 0 || seqOf(es, "deadline_expired") < seqOf(es, "journal_torn") {
		t.Fatalf("journal: %+v", es)
	}
	code, _, stderr := aw(t, root, "verify", "torn")
	if code != 1 || !strings.Contains(stderr, "journal_torn") {
		t.Fatalf("verify of a torn journal: exit %d: %s", code, stderr)
	}
}

// A read-only root and the wrapper dead: the watchdog stops the run anyway
// (the intent cannot be journaled, and the lease wins), says so; once the
// root is writable again the same watchdog records the gap, in the journal
// (intent_unrecorded) and in the record.
func TestReadOnlyRootStillStops(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	mnt := runtest.Tmpfs(t, 16<<20)
	root := filepath.Join(mnt, "runs")
	// The job lets go of its logs: a file system with a file open for
	// writing cannot be remounted read-only (a failing disk's emergency
	// remount can, but a test cannot make one).
	r, rec := startOrphan(t, root, "ro", "sh", "-c", "exec >/dev/null 2>&1; sleep 300 & sleep 300 & wait")
	watchdogOnce(t, root) // makes the watchdog's lock file while it can
	dl := endLease(t, root, r)
	runtest.Remount(t, mnt, true)
	t.Cleanup(func() { unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_REMOUNT, "") })
	if err := os.WriteFile(filepath.Join(root, "probe"), nil, 0o600); err == nil {
		t.Fatal("the root is still writable")
	}
	const interval = 200 * time.Millisecond
	from := time.Now() // the bound holds while a watchdog runs
	if from.Before(dl) {
		from = dl
	}
	wd := runtest.Start(t, root, "watchdog", "--interval", interval.String())
	var gone time.Time
	runtest.Eventually(t, "the watchdog to stop the run on a read-only root", func() bool {
		gone = time.Now()
		return len(runtest.GroupOf(rec.PGID, rec.LeaderStart)) == 0
	})
	// The lease is the last word: deadline (or the watchdog's start, if
	// later) + grace + one interval + 3 s (and the 50 ms this test may take
	// to look again).
	if bound := from.Add(time.Second + interval + 3*time.Second + 50*time.Millisecond); gone.After(bound) {
		t.Fatalf("the job was seen gone at %s, %v after the bound %s", gone.Format(time.RFC3339Nano), gone.Sub(bound), bound.Format(time.RFC3339Nano))
	}
	runtest.Eventually(t, "the watchdog to say so", func() bool { return strings.Contains(wd.Stdout.String(), `"action":"stopped"`) })
	if a := parseActions(t, firstLine(wd.Stdout.String()))["ro"]; a.Action != "stopped" || !strings.Contains(a.Reason, "intent_unrecorded") {
		t.Fatalf("watchdog's action on a read-only root: %+v", a)
	}
	runtest.Remount(t, mnt, false)
	var got *statusfile.Record
	runtest.Eventually(t, "the final record once the root is writable", func() bool {
		got = r.Status()
		return got != nil && statusfile.Terminal(got.State)
	})
	if got.State != statusfile.Cancelled || got.Code() != 124 || !got.IntentUnrecorded {
		t.Fatalf("record: state %s code %d intent_unrecorded %v", got.State, got.Code(), got.IntentUnrecorded)
	}
	if seqOf(r.Journal(t), "intent_unrecorded") < 0 {
		t.Fatalf("no intent_unrecorded line: %v", r.Events(t))
	}
	unix.Kill(wd.Process.Pid, unix.SIGTERM)
	wd.Wait(t)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// A torn record and the wrapper dead: status.json garbage or empty, or
// deadline_epoch garbage. The run is judged from its other files (journal,
// pid, pgid): the watchdog stops it once its lease has expired, and cancel
// stops it; the final record is the rebuilt one, saying so.
func TestTornRecordStillStops(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	for _, tc := range []struct {
		name, file, content string
		by                  string // watchdog or cancel
	}{
		{"status-garbage", "status.json", "{\"schema\":1,\"run_id\":\"x", "watchdog"},
		{"status-empty", "status.json", "", "cancel"},
		{"deadline-garbage", "deadline_epoch", "soon\n", "watchdog"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := runtest.NewRoot(t)
			id := "tr-" + tc.name
			r, rec := startOrphan(t, root, id, "sh", "-c", "sleep 300 & sleep 300 & wait")
			var dl time.Time
			if tc.by == "watchdog" {
				dl = endLease(t, root, r)
			}
			if err := os.WriteFile(filepath.Join(r.Dir(), tc.file), []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			switch tc.by {
			case "watchdog":
				runtest.Eventually(t, "the deadline to pass", func() bool { return time.Now().After(dl) })
				if a := watchdogOnce(t, root)[id]; a.Action != "stopped" {
					t.Fatalf("watchdog: %+v", a)
				}
			case "cancel":
				if code, out, stderr := aw(t, root, "cancel", "--wait", "10s", id); code != 0 {
					t.Fatalf("cancel: exit %d: %s %s", code, out, stderr)
				}
			}
			assertStopped(t, rec)
			got := r.MustStatus(t)
			want := 124
			if tc.by == "cancel" {
				want = 143
			}
			if got.State != statusfile.Cancelled || got.Code() != want || got.PID != rec.PID {
				t.Fatalf("record: state %s code %d pid %d", got.State, got.Code(), got.PID)
			}
			if tc.file == "status.json" && !got.Rebuilt {
				t.Fatal("the record does not say it was rebuilt")
			}
		})
	}
}

// The record and the journal both torn (status.json garbage, events.jsonl
// emptied: no created line to rebuild from) while the wrapper is stopped
// (SIGSTOP): the watchdog rebuilds the run from the pid files and the live
// leader (a session leader that started before the pid file was written),
// finds the run's cgroup from the leader's, and once the lease has expired
// and the wrapper has not acted, stops every process of it, the one that
// left the session by setsid too. The final record says it was rebuilt.
func TestTornRecordAndJournalStillStops(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	escFile := filepath.Join(t.TempDir(), "escaped")
	c, r := startRun(t, root, "tj", "--lease", "5m", "--grace", "1s", "--no-stream", "tj", "--",
		"sh", "-c", "setsid sleep 300 & echo $! > "+escFile+"; sleep 300")
	rec := r.WaitState(t, statusfile.Running)
	if rec.Cgroup == "" {
		t.Fatalf("this host gave the run no cgroup (boundary %s): the tests run as root with a writable cgroup v2 tree", rec.Boundary)
	}
	var esc int
	runtest.Eventually(t, "the escaped child's PID", func() bool {
		b, err := os.ReadFile(escFile)
		esc, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && esc > 1
	})
	escSt, err := proc.ReadStat(esc)
	if err != nil {
		t.Fatal(err)
	}
	r.StopOutsideLock(t, rec.WrapperPID)
	t.Cleanup(func() { unix.Kill(rec.WrapperPID, unix.SIGCONT); c.Wait(t) })
	dl := endLease(t, root, r)
	if err := os.WriteFile(filepath.Join(r.Dir(), "status.json"), []byte("{\"sch"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(r.Dir(), "events.jsonl"), 0); err != nil {
		t.Fatal(err)
	}
	// The wrapper is alive (stopped): the watchdog gives it ActAfter past
	// the deadline, then acts.
	var a watchdog.Action
	runtest.Eventually(t, "the watchdog to stop the run", func() bool {
		if time.Now().Before(dl) {
			return false
		}
		a = watchdogOnce(t, root)["tj"]
		if a.Action == "skipped" || a.Action == "refused" {
			t.Fatalf("watchdog: %+v", a)
		}
		return a.Action == "stopped"
	})
	if !strings.Contains(a.Reason, "has not acted") || !strings.Contains(a.Reason, "rebuilt") {
		t.Fatalf("watchdog's reason: %q; want the wrapper found alive and not acting, and the record rebuilt", a.Reason)
	}
	assertStopped(t, rec)
	if !runtest.Within(runtest.Patience, func() bool { return !proc.Alive(esc, escSt.Start) }) {
		t.Fatalf("the child that left the session by setsid (%d) outlived the watchdog's stop", esc)
	}
	got := r.MustStatus(t)
	if got.State != statusfile.Cancelled || got.Code() != 124 || got.PID != rec.PID || !got.Rebuilt ||
		got.Cgroup != rec.Cgroup || got.WrapperPID != rec.WrapperPID || got.Containment != statusfile.ContainmentCgroup {
		t.Fatalf("record: state %s code %d pid %d rebuilt %v cgroup %q wrapper %d containment %q",
			got.State, got.Code(), got.PID, got.Rebuilt, got.Cgroup, got.WrapperPID, got.Containment)
	}
}

// A deadline_epoch written by hand, later than the journal's last deadline,
// revives nothing: authorize refuses the job's processes past the journal's
// deadline, the wrapper stops the run at it and says the file was ignored,
// and renew is refused.
func TestHandWrittenDeadlineRevivesNothing(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "revive", "--lease", "5m", "--grace", "1s", "--no-stream", "revive", "--", "sleep", "300")
	rec := r.WaitState(t, statusfile.Running)
	// The wrapper is stopped while the lease is ended and the later
	// deadline written, so what it finds when it goes on is both, whatever
	// the machine's load.
	r.StopOutsideLock(t, rec.WrapperPID)
	t.Cleanup(func() { unix.Kill(rec.WrapperPID, unix.SIGCONT) })
	dl := endLease(t, root, r)
	later := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10) + "\n"
	path := filepath.Join(r.Dir(), "deadline_epoch")
	if err := os.WriteFile(path+".hand", []byte(later), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".hand", path); err != nil {
		t.Fatal(err)
	}
	// Past the journal's deadline, with the wrapper still stopped, no
	// authority is revived either: authorize refuses the job.
	runtest.Eventually(t, "the journal's deadline to pass", func() bool { return time.Now().After(dl) })
	code, out, _ := aw(t, root, "authorize", "--pid", strconv.Itoa(rec.PID))
	if code != 1 || !strings.Contains(out, "lease_expired") {
		t.Fatalf("authorize past the journal's deadline: exit %d: %s", code, out)
	}
	if err := unix.Kill(rec.WrapperPID, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(t); code != 124 {
		t.Fatalf("exit %d, want 124\n%s", code, c.Stderr.String())
	}
	assertStopped(t, rec)
	if !strings.Contains(c.Stderr.String(), "ignored") {
		t.Fatalf("the wrapper did not report the ignored deadline_epoch:\n%s", c.Stderr.String())
	}
	if code, _, stderr := aw(t, root, "renew", "revive"); code != 1 {
		t.Fatalf("renew after the expiry: exit %d: %s", code, stderr)
	}
}

// verify catches a journal cut at a line boundary, which still chains: the
// record names the journal's last line as it was when the record was
// written, and a terminal record has a final line after it.
func TestVerifyCatchesAJournalCutAtALineBoundary(t *testing.T) {
	root := runtest.NewRoot(t)
	if code, _, stderr := aw(t, root, "run", "cut", "--", "true"); code != 0 {
		t.Fatalf("run: exit %d: %s", code, stderr)
	}
	r := runtest.Run{Root: root, ID: "cut"}
	if code, out, stderr := aw(t, root, "verify", "cut"); code != 0 {
		t.Fatalf("verify of a whole journal: exit %d %s %s", code, out, stderr)
	}
	events := filepath.Join(r.Dir(), "events.jsonl")
	whole, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(whole), "\n"), "\n")
	for cut := 1; cut <= 2; cut++ {
		kept := strings.Join(lines[:len(lines)-cut], "")
		if err := os.WriteFile(events, []byte(kept), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := aw(t, root, "verify", "cut")
		if code != 1 || !strings.Contains(stderr, "cut") {
			t.Fatalf("verify of a journal without its last %d lines: exit %d: %s", cut, code, stderr)
		}
	}
}

// Removing a live run's directory frees its ID: the wrapper notices, stops
// the job (exit 143) and says why.
func TestRemovedRunDirectoryStopsTheJob(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "gone", "--lease", "5m", "--grace", "1s", "--no-stream", "gone", "--", "sh", "-c", "sleep 300 & sleep 300 & wait")
	rec := r.WaitState(t, statusfile.Running)
	t.Cleanup(func() { runtest.KillGroup(rec.PGID, rec.LeaderStart) })
	if err := os.RemoveAll(r.Dir()); err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(t); code != 143 {
		t.Fatalf("exit %d, want 143\n%s", code, c.Stderr.String())
	}
	if !strings.Contains(c.Stderr.String(), "removed") {
		t.Fatalf("the wrapper did not say why it stopped:\n%s", c.Stderr.String())
	}
	assertStopped(t, rec)
}

// A writer killed at its final rename (strace injects SIGKILL at the
// rename) leaves a .status.json.PID.* temp file; the next durable write of
// the record removes it, and the live writer's own temp is never taken.
func TestStaleTempRecordIsRemoved(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI machines have strace")
		}
		t.Skip("no strace here")
	}
	root := runtest.NewRoot(t)
	// A run left cancelling by a wrapper killed in its grace: its job
	// ignores TERM.
	c, r := startRun(t, root, "tmp1", "--lease", "5m", "--grace", "5m", "--no-stream", "tmp1", "--", "sh", "-c", "trap '' TERM; sleep 300 & wait; wait")
	rec := r.WaitState(t, statusfile.Running)
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	r.WaitState(t, statusfile.Cancelling)
	killWrapper(t, c, rec)
	// cancel, killed at its first (and only) rename: the final record's.
	// Counted per thread (strace's "per tracee"), so the first rename of
	// every thread is hit: cancel makes only one.
	cmd := exec.Command("strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=/^renameat",
		"-e", "inject=/^renameat:error=EIO:signal=SIGKILL:when=1",
		runtest.Binary(t), "cancel", "--grace", "1s", "--wait", "10s", "tmp1")
	cmd.Env = append(os.Environ(), "AGENT_WRAP_ROOT="+root)
	out, _ := cmd.CombinedOutput()
	temps := func() []string {
		m, _ := filepath.Glob(filepath.Join(r.Dir(), ".status.json.*"))
		return m
	}
	if len(temps()) == 0 {
		t.Fatalf("no temp file left by the cancel killed at its rename (the fault was not injected?)\n%s", out)
	}
	if got := r.MustStatus(t); statusfile.Terminal(got.State) {
		t.Fatalf("the record is %s although the rename was killed", got.State)
	}
	assertStopped(t, rec)
	if code, out, stderr := aw(t, root, "cancel", "--wait", "10s", "tmp1"); code != 0 {
		t.Fatalf("cancel: exit %d %s %s", code, out, stderr)
	}
	if left := temps(); len(left) > 0 {
		t.Fatalf("temp files left after the final record: %v", left)
	}
	if got := r.MustStatus(t); got.State != statusfile.Cancelled {
		t.Fatalf("record: %s", got.State)
	}
}
