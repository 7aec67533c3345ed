//go:build linux

package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

// slack is what a loaded machine adds to the contract's bound (deadline +
// grace + one watchdog interval + ActAfter) between a process's death and
// the final record saying so: start-up of the watchdog's pass, the reads
// of /proc, the record's fsyncs.
const slack = 3 * time.Second

// A stuck is an agent-wrap command run under strace, which stops it (a
// tracer's stop, state t) or kills it at one exact system call.
type stuck struct {
	cmd   *exec.Cmd
	group *runtest.Group
	out   runtest.Buffer
	proc  proc.Stat // the agent-wrap process, once found
}

// underStrace starts the binary with args under strace with the options
// given (a -e inject=... for the fault). strace counts a system call's
// invocations per thread, and the Go runtime moves goroutines between
// threads, so an injection is pinned with when=1 (the process's first
// call) or a path (-P), never a count above one.
func underStrace(t *testing.T, root string, options []string, args ...string) *stuck {
	t.Helper()
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatalf("strace is needed (.ci/deps installs it): %v", err)
	}
	s := &stuck{}
	argv := append([]string{"-f", "-qq", "-o", "/dev/null"}, options...)
	s.cmd = exec.Command("strace", append(append(argv, runtest.Binary(t)), args...)...)
	s.cmd.Env = append(os.Environ(), "AGENT_WRAP_ROOT="+root)
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	// Cleanup KILLs strace and the command it traces, by group.
	s.group = runtest.StartInGroup(t, s.cmd)
	return s
}

// tracedCalls returns the lines of strace -f output b (one PID a line)
// that start a system call matching call and do not say it failed. A call
// that another thread's event interrupts in the trace is printed
// "<unfinished ...>", its result on a later line: it is counted by its
// first line, so no call is missed.
func tracedCalls(b []byte, call string) [][]byte {
	failed := regexp.MustCompile(`= -1 [A-Z]+`)
	var out [][]byte
	for _, l := range regexp.MustCompile(`(?m)^\d+ +`+call+`.*$`).FindAll(b, -1) {
		if !failed.Match(l) {
			out = append(out, l)
		}
	}
	return out
}

// stopAt is strace's options that stop the process (SIGSTOP) at every
// call of syscall, or at its first (first), optionally only on path.
func stopAt(syscall string, first bool, path string) []string {
	o := []string{"-e", "trace=" + syscall, "-e", "inject=" + syscall + ":signal=SIGSTOP"}
	if first {
		o[3] += ":when=1"
	}
	if path != "" {
		o = append(o, "-P", path)
	}
	return o
}

// stoppedHolding starts an agent-wrap command under strace with options
// that stop it, and waits until it holds run r's lock, stopped.
func stoppedHolding(t *testing.T, root string, r runtest.Run, options []string, args ...string) *stuck {
	t.Helper()
	s := underStrace(t, root, options, args...)
	s.waitStopped(t, r, nil)
	return s
}

// waitStopped waits until the process holds run r's lock, stopped, and
// cond (if set) holds.
func (s *stuck) waitStopped(t *testing.T, r runtest.Run, cond func() bool) {
	t.Helper()
	runtest.Eventually(t, fmt.Sprintf("%v to hold run %s's lock, stopped", s.cmd.Args[len(s.cmd.Args)-2:], r.ID), func() bool {
		for _, pid := range lockHolders(r.Dir()) {
			st, err := proc.ReadStat(pid)
			if err == nil && st.PPID == s.cmd.Process.Pid && (st.State == 't' || st.State == 'T') && (cond == nil || cond()) {
				s.proc = st
				return true
			}
		}
		return false
	})
}

// cont lets the stopped process go on.
func (s *stuck) cont(t *testing.T) {
	t.Helper()
	if err := stop.Signal(proc.Identity{PID: s.proc.PID, Start: s.proc.Start}, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// lockHolders lists the PIDs holding a lock on path, from /proc/locks.
func lockHolders(path string) []int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil
	}
	pids, _ := proc.LockHolders(uint64(st.Dev), st.Ino)
	return pids
}

// resume lets the stopped process go on, through any later stop strace
// injects (a late final line's fsync, or a call that strace counts as the
// first of another thread), and returns its exit code.
func (s *stuck) resume(t *testing.T) int {
	t.Helper()
	s.cont(t)
	id := proc.Identity{PID: s.proc.PID, Start: s.proc.Start}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for until := time.Now().Add(runtest.Patience); time.Now().Before(until); {
		select {
		case <-s.group.Done():
			return s.cmd.ProcessState.ExitCode()
		case <-tick.C:
		}
		if st, err := proc.ReadStat(s.proc.PID); err == nil && st.Start == s.proc.Start && (st.State == 't' || st.State == 'T') {
			_ = stop.Signal(id, unix.SIGCONT)
		}
	}
	return s.wait(t)
}

// wait waits for strace, and returns the exit code it passes on.
func (s *stuck) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-s.group.Done():
	case <-time.After(runtest.Patience):
		t.Fatalf("%v did not exit within %v\n%s", s.cmd.Args, runtest.Patience, s.out.String())
	}
	return s.cmd.ProcessState.ExitCode()
}

// orphanedPair starts runs a-long and b-short, with the graces long and
// short, whose jobs (sh and a sleep) ignore TERM, and SIGKILLs both
// wrappers: two orphans for a watchdog to stop.
func orphanedPair(t *testing.T, root string, long, short time.Duration) (a, b runtest.Run) {
	t.Helper()
	job := []string{"sh", "-c", "trap '' TERM; sleep 300 & wait"}
	a, _ = orphanWith(t, root, "a-long", []string{"--grace", long.String()}, 2, job...)
	b, _ = orphanWith(t, root, "b-short", []string{"--grace", short.String()}, 2, job...)
	return a, b
}

// endedWithin fails the test unless the run's final record was written no
// later than bound after from.
func endedWithin(t *testing.T, rec *statusfile.Record, from time.Time, bound time.Duration, what string) {
	t.Helper()
	ended, err := time.Parse(time.RFC3339Nano, rec.EndedAt)
	if err != nil {
		t.Fatalf("run %s: ended_at %q: %v", rec.RunID, rec.EndedAt, err)
	}
	if took := ended.Sub(from); took > bound {
		t.Errorf("run %s ended %v after %s, past the bound of %v", rec.RunID, took.Round(time.Millisecond), what, bound)
	}
}

// at returns the time of the last journal line of the run with event.
func at(t *testing.T, r runtest.Run, event string) time.Time {
	t.Helper()
	es := r.Journal(t)
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Event == event {
			return es[i].At
		}
	}
	t.Fatalf("run %s: no %s in the journal: %v", r.ID, event, r.Events(t))
	return time.Time{}
}

// actions parses the watchdog's JSON lines.
func actions(t *testing.T, out string) map[string]watchdog.Action {
	t.Helper()
	m := map[string]watchdog.Action{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var a watchdog.Action
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("watchdog line %q: %v", sc.Text(), err)
		}
		m[a.RunID] = a
	}
	return m
}

// One stopped holder of a run's lock freezes nothing else. A renew of
// a-held that ends its lease is stopped by strace in its write of the
// journal's lease_renewed line (the line is written: the lease is now
// over a second later; the renew holds the run's lock and the journal's,
// and has not replaced deadline_epoch yet); b-orphan's wrapper is dead and
// its lease ended. The watchdog service stops both within deadline +
// grace + its interval + ActAfter: a-held without the lock (it says so,
// naming the renew's PID), b-orphan as if nothing were stuck. Resumed,
// the renew finishes, the final record stays as the watchdog wrote it,
// and the renew, finding the run over, appends the final line the
// watchdog could not journal: verify passes.
func TestStoppedLockHolderDelaysNoStop(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	root := runtest.NewRoot(t)
	const grace, interval = time.Second, time.Second
	ca, a := startRun(t, root, "a-held", "--lease", "5m", "--grace", "1s", "a-held", "--", "sh", "-c", "sleep 300 & wait")
	b, _ := orphanWith(t, root, "b-orphan", []string{"--grace", "1s"}, 2, "sh", "-c", "sleep 300 & wait")
	a.WaitState(t, statusfile.Running)
	wd := runtest.Start(t, root, "watchdog", "--interval", interval.String())

	dlB := endLease(t, root, b)
	// Under strace the renew is also seen stopped ('t') at the write's
	// entry, before the line is written: it counts as stopped once the
	// line is there (strace's SIGSTOP lands as the write returns).
	s := underStrace(t, root, stopAt("write", true, a.Dir()+"/events.jsonl"), "renew", "--lease", "1s", "a-held")
	s.waitStopped(t, a, func() bool {
		f, err := os.Open(filepath.Join(a.Dir(), "events.jsonl"))
		if err != nil {
			return false
		}
		defer f.Close()
		es, err := journal.ReadAll(f)
		return err == nil && len(es) > 0 && es[len(es)-1].Event == "lease_renewed"
	})
	dlA := time.Unix(journaledDeadline(t, a), 0)
	if time.Until(dlA) > 3*time.Second {
		t.Fatalf("a-held's deadline is %v away: the stopped renew had not journaled its renewal", time.Until(dlA))
	}

	for _, x := range []struct {
		r  runtest.Run
		dl time.Time
	}{{a, dlA}, {b, dlB}} {
		rec := x.r.WaitState(t, statusfile.Cancelled)
		if rec.Cause != statusfile.CauseLease {
			t.Errorf("run %s: cause %s, want lease", x.r.ID, rec.Cause)
		}
		endedWithin(t, rec, x.dl, grace+interval+watchdog.ActAfter+slack, "its deadline")
		x.r.AssertGroupEmpty(t)
	}
	var act watchdog.Action
	runtest.Eventually(t, "the watchdog to report a-held's stop", func() bool {
		act = actions(t, lines(wd.Stdout.String()))["a-held"]
		return act.Action != ""
	})
	if act.Action != "stopped" || len(act.WithoutLock) != 1 || !strings.Contains(act.WithoutLock[0], "pid "+strconv.Itoa(s.proc.PID)) {
		t.Errorf("watchdog on a-held: %+v; want stopped without the lock of pid %d", act, s.proc.PID)
	}

	final := a.File("status.json")
	if code := s.resume(t); code != 0 {
		t.Errorf("the resumed renew: exit %d\n%s", code, s.out.String())
	}
	ca.Wait(t)
	if got := a.File("status.json"); got != final {
		t.Errorf("the record changed after the watchdog's final one:\n%s\nnow:\n%s", final, got)
	}
	if code, out, errOut := aw(t, root, "verify", "a-held"); code != 0 {
		t.Errorf("verify a-held: exit %d\n%s%s", code, out, errOut)
	}
	// The renew appends them as it finds the run over, unless the
	// watchdog service's pass got the journal's lock first.
	assertLateFinal(t, a, "renew", "watchdog")
}

// journaledDeadline is the deadline of run r's last lease_renewed line,
// the lease as the journal has it (the journal is the lease's record).
func journaledDeadline(t *testing.T, r runtest.Run) int64 {
	t.Helper()
	es := r.Journal(t)
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Event == "lease_renewed" {
			if v, ok := es[i].Fields["deadline_epoch"].(float64); ok {
				return int64(v)
			}
		}
	}
	t.Fatalf("run %s: no lease_renewed line with a deadline: %v", r.ID, r.Events(t))
	return 0
}

// assertLateFinal checks that run r's journal has the lines a stop that
// bypassed a stuck holder of the journal's lock could not write, appended
// late by one of bys: intent_unrecorded, then the one final line, both
// saying late and by the same, the final one with the record's state,
// cause, exit code and ended_at. (A wrapper still alive may journal after them.)
func assertLateFinal(t *testing.T, r runtest.Run, bys ...string) {
	t.Helper()
	rec := r.MustStatus(t)
	es := r.Journal(t)
	var intent, final []journal.Entry
	for _, e := range es {
		switch e.Event {
		case "intent_unrecorded":
			intent = append(intent, e)
		case "final":
			final = append(final, e)
		}
	}
	if len(final) != 1 || len(intent) != 1 || intent[0].Seq > final[0].Seq {
		t.Fatalf("run %s: journal %v; want one intent_unrecorded, then one final (appended late)", r.ID, r.Events(t))
	}
	by, _ := final[0].Fields["by"].(string)
	for _, e := range []journal.Entry{intent[0], final[0]} {
		if e.Fields["late"] != true || !slices.Contains(bys, by) || e.Fields["by"] != by {
			t.Errorf("run %s: %s line %v; want late, by one of %v (both lines by the same)", r.ID, e.Event, e.Fields, bys)
		}
	}
	f := final[0].Fields
	if f["state"] != rec.State || f["cause"] != rec.Cause || f["exit_code"] != float64(rec.Code()) || f["ended_at"] != rec.EndedAt {
		t.Errorf("run %s: late final line %v; the record says %s, cause %s, exit %d", r.ID, f, rec.State, rec.Cause, rec.Code())
	}
}

// lines keeps the whole lines of s (a process may be writing its last).
func lines(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[:i+1]
	}
	return ""
}

// While a stopped renew (in its write of the journal's lease_renewed line,
// its only write there) holds a run's lock, `cancel --wait 2s` and another
// renew give up (exit 1) instead of waiting for ever, naming the holder's
// PID and saying how to resume it; once it is resumed, cancel works.
func TestCancelNamesAStoppedLockHolder(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "held", "--lease", "5m", "--grace", "1s", "held", "--", "sleep", "300")
	r.WaitState(t, statusfile.Running)
	s := stoppedHolding(t, root, r, stopAt("write", true, r.Dir()+"/events.jsonl"), "renew", "held")
	pid := strconv.Itoa(s.proc.PID)

	code, out, errOut := aw(t, root, "cancel", "--wait", "2s", "held")
	if code != 1 || !strings.Contains(errOut, "pid "+pid) || !strings.Contains(errOut, "stopped") || !strings.Contains(errOut, "kill -CONT "+pid) {
		t.Errorf("cancel --wait 2s under a stopped holder: exit %d\n%s%s\nwant 1, naming pid %s and how to resume it", code, out, errOut, pid)
	}
	code, out, errOut = aw(t, root, "renew", "held")
	if code != 1 || !strings.Contains(errOut, "pid "+pid) {
		t.Errorf("renew under a stopped holder: exit %d\n%s%s\nwant 1, naming pid %s", code, out, errOut, pid)
	}
	if rec := r.MustStatus(t); rec.State != statusfile.Running {
		t.Fatalf("state %s after the refused cancel, want running", rec.State)
	}

	if code := s.resume(t); code != 0 {
		t.Fatalf("the resumed renew: exit %d\n%s", code, s.out.String())
	}
	if code, out, errOut := aw(t, root, "cancel", "held"); code != 0 {
		t.Fatalf("cancel once the holder is gone: exit %d\n%s%s", code, out, errOut)
	}
	if code := c.Wait(t); code != 143 {
		t.Errorf("the run's exit %d, want 143", code)
	}
	r.AssertGroupEmpty(t)
}

// A cancel of a run whose wrapper is dead and lease over is stopped by
// strace while it holds the run's lock: in its first fsync (the intent's,
// in the journal, whose lock it holds too), or, let go on from there, in
// its second (its `cancelling` record's, before the rename). `watchdog
// --once` stops the run without the lock, and the cancel, resumed, finds
// the run over and changes nothing (exit 0, already): the record stays the
// watchdog's, though the cancel's rename was due. Where the journal was
// free, it says lock_bypassed, naming the cancel, and the final line says
// without_lock. Where the cancel held the journal's lock too, the watchdog
// could journal neither its intent nor its final line (verify says the
// final line is missing); the woken cancel, finding the run over, appends
// them, late, and verify passes.
func TestWokenCancelChangesNothing(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	for _, tc := range []struct {
		name   string
		record bool // stopped in the record's fsync; the journal's lock is free
	}{
		{"in-the-journals-fsync", false},
		{"in-the-records-fsync", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := runtest.NewRoot(t)
			r, rec := orphanWith(t, root, "woken", []string{"--grace", "1s"}, 2, "sh", "-c", "sleep 300 & wait")
			expireLease(t, root, r)
			s := stoppedHolding(t, root, r, stopAt("fsync", false, ""), "cancel", "woken")
			if tc.record {
				s.cont(t)
				s.waitStopped(t, r, func() bool {
					m, _ := filepath.Glob(filepath.Join(r.Dir(), ".status.json.*"))
					return len(m) == 1
				})
			}
			pid := "pid " + strconv.Itoa(s.proc.PID)

			code, out, errOut := aw(t, root, "watchdog", "--once")
			act := actions(t, out)["woken"]
			if code != 0 || act.Action != "stopped" || len(act.WithoutLock) != 1 || !strings.Contains(act.WithoutLock[0], pid) {
				t.Fatalf("watchdog --once: exit %d, %+v\n%s; want woken stopped without the lock of %s\nrecord:\n%s\njournal:\n%s", code, act, errOut, pid, r.File("status.json"), r.File("events.jsonl"))
			}
			r.AssertGroupEmpty(t)
			rec = r.MustStatus(t)
			if rec.State != statusfile.Cancelled || rec.Cause != statusfile.CauseLease {
				t.Fatalf("state %s cause %s, want cancelled by the lease\njournal:\n%s", rec.State, rec.Cause, r.File("events.jsonl"))
			}
			if tc.record {
				var bypassed, final bool
				for _, e := range r.Journal(t) {
					if e.Event == "lock_bypassed" {
						hs, _ := e.Fields["holders"].([]any)
						bypassed = len(hs) == 1 && strings.Contains(fmt.Sprint(hs[0]), pid)
					}
					if e.Event == "final" {
						final = e.Fields["without_lock"] == true
					}
				}
				if !bypassed || !final {
					t.Errorf("journal: lock_bypassed naming %s %v, final without_lock %v: %v", pid, bypassed, final, r.Events(t))
				}
			}
			if !tc.record {
				if code, out, errOut := aw(t, root, "verify", "woken"); code != 1 || !strings.Contains(errOut, "no final line") {
					t.Errorf("verify while the cancel holds the journal: exit %d\n%s%s\nwant 1, no final line", code, out, errOut)
				}
			}
			wrote := r.File("status.json")
			if code := s.resume(t); code != 0 || !strings.Contains(s.out.String(), "already cancelled") {
				t.Errorf("the resumed cancel: exit %d\n%s\nwant 0, already cancelled", code, s.out.String())
			}
			if got := r.File("status.json"); got != wrote {
				t.Errorf("the woken cancel changed the record:\n%s\nnow:\n%s", wrote, got)
			}
			if code, out, errOut := aw(t, root, "verify", "woken"); code != 0 {
				t.Errorf("verify: exit %d\n%s%s", code, out, errOut)
			}
			if !tc.record {
				assertLateFinal(t, r, "cancel")
			}
		})
	}
}

// A cancel stopped in its intent's fsync, holding the run's lock and the
// journal's, is killed instead of resumed once `watchdog --once` stopped
// the run without either: its death frees the journal's lock, and the
// next `watchdog --once` appends the intent_unrecorded and final lines the
// stop could not, late, leaving the record as the stop wrote it; verify,
// which failed until then, passes.
func TestWatchdogCompletesAJournalAKilledHolderKept(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	root := runtest.NewRoot(t)
	r, _ := orphanWith(t, root, "kept", []string{"--grace", "1s"}, 2, "sh", "-c", "sleep 300 & wait")
	expireLease(t, root, r)
	s := stoppedHolding(t, root, r, stopAt("fsync", false, ""), "cancel", "kept")

	code, out, errOut := aw(t, root, "watchdog", "--once")
	if act := actions(t, out)["kept"]; code != 0 || act.Action != "stopped" || len(act.WithoutLock) != 1 {
		t.Fatalf("watchdog --once: exit %d, %+v\n%s; want kept stopped without the lock", code, act, errOut)
	}
	r.AssertGroupEmpty(t)
	if code, out, errOut := aw(t, root, "verify", "kept"); code != 1 || !strings.Contains(errOut, "no final line") {
		t.Errorf("verify while the cancel holds the journal: exit %d\n%s%s\nwant 1, no final line", code, out, errOut)
	}
	wrote := r.File("status.json")

	if err := stop.Signal(proc.Identity{PID: s.proc.PID, Start: s.proc.Start}, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.wait(t)
	if code, out, errOut := aw(t, root, "watchdog", "--once"); code != 0 || actions(t, out)["kept"].Action != "" {
		t.Errorf("the next watchdog --once: exit %d\n%s%s; want 0, no action on kept", code, out, errOut)
	}
	if got := r.File("status.json"); got != wrote {
		t.Errorf("the record changed:\n%s\nnow:\n%s", wrote, got)
	}
	if code, out, errOut := aw(t, root, "verify", "kept"); code != 0 {
		t.Errorf("verify: exit %d\n%s%s", code, out, errOut)
	}
	assertLateFinal(t, r, "watchdog")
}

// Two orphaned runs past their lease, one with a 15 s grace, the other
// with 1 s, both ignoring TERM: one `watchdog --once` stops them side by
// side, so the short one ends within its own grace, not after the long
// one's.
func TestWatchdogStopsRunsSideBySide(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	root := runtest.NewRoot(t)
	const long, short = 15 * time.Second, time.Second
	a, b := orphanedPair(t, root, long, short)
	dl := endLease(t, root, a)
	if d := endLease(t, root, b); d.After(dl) {
		dl = d
	}
	runtest.Eventually(t, "the deadlines to pass", func() bool { return time.Now().After(dl) })

	start := time.Now()
	wd := runtest.Start(t, root, "watchdog", "--once")
	rb := b.WaitState(t, statusfile.Cancelled)
	endedWithin(t, rb, start, short+slack, "the watchdog's start")
	b.AssertGroupEmpty(t)
	if code := wd.Wait(t); code != 0 {
		t.Fatalf("watchdog --once: exit %d\n%s", code, wd.Stderr.String())
	}
	ra := a.MustStatus(t)
	if ra.State != statusfile.Cancelled {
		t.Fatalf("a-long is %s after the pass, want cancelled", ra.State)
	}
	a.AssertGroupEmpty(t)
	if ended, _ := time.Parse(time.RFC3339Nano, ra.EndedAt); ended.Sub(start) < long {
		t.Errorf("a-long ended %v after the watchdog's start, within its %v grace: its TERM was not ignored", ended.Sub(start), long)
	}
	acts := actions(t, wd.Stdout.String())
	if acts["a-long"].Action != "stopped" || acts["b-short"].Action != "stopped" {
		t.Errorf("watchdog output:\n%s", wd.Stdout.String())
	}
}

// A wrapper stopped (SIGSTOP) while its run is `cancelling` no longer
// holds the lease back: cancelled by `cancel` while stopped, or stopped
// in its own grace after the lease ended, the run is taken over by the
// watchdog within the intent + grace + interval + ActAfter, whatever the
// wrapper's state; resumed, the wrapper finds the run over and exits
// with the record's code, the record unchanged.
func TestWatchdogTakesOverAStoppedWrapper(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	const interval = time.Second
	check := func(t *testing.T, root string, c *runtest.Cmd, r runtest.Run, rec *statusfile.Record, intent string, grace time.Duration, code int) {
		t.Helper()
		wd := runtest.Start(t, root, "watchdog", "--interval", interval.String())
		final := r.WaitState(t, statusfile.Cancelled)
		endedWithin(t, final, at(t, r, intent), grace+interval+watchdog.ActAfter+slack, intent)
		r.AssertGroupEmpty(t)
		wrote := r.File("status.json")
		if err := unix.Kill(rec.WrapperPID, unix.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if got := c.Wait(t); got != code {
			t.Errorf("the resumed wrapper: exit %d, want %d\n%s", got, code, c.Stderr.String())
		}
		if got := r.File("status.json"); got != wrote {
			t.Errorf("the resumed wrapper changed the record:\n%s\nnow:\n%s", wrote, got)
		}
		if a := actions(t, lines(wd.Stdout.String()))[r.ID]; a.Action != "stopped" || !strings.Contains(a.Reason, "stopped") {
			t.Errorf("watchdog: %+v; want stopped, saying the wrapper is stopped", a)
		}
	}

	t.Run("cancelled-while-stopped", func(t *testing.T) {
		root := runtest.NewRoot(t)
		const grace = time.Second
		c, r := startRun(t, root, "frozen", "--lease", "5m", "--grace", grace.String(), "frozen", "--", "sh", "-c", "sleep 300 & wait")
		rec := r.WaitState(t, statusfile.Running)
		runtest.Eventually(t, "group populated", func() bool { return len(runtest.Members(rec.PGID)) == 2 })
		r.StopOutsideLock(t, rec.WrapperPID)
		if code, out, errOut := aw(t, root, "cancel", "--wait", "1s", "frozen"); code != 1 {
			t.Fatalf("cancel of a run with a stopped wrapper: exit %d, want 1 (not confirmed)\n%s%s", code, out, errOut)
		}
		if got := r.MustStatus(t); got.State != statusfile.Cancelling {
			t.Fatalf("state %s after the cancel, want cancelling", got.State)
		}
		check(t, root, c, r, rec, "cancel_requested", grace, 143)
	})

	t.Run("stopped-in-its-grace", func(t *testing.T) {
		root := runtest.NewRoot(t)
		const grace = 5 * time.Second
		c, r := startRun(t, root, "graced", "--lease", "5m", "--grace", grace.String(), "graced", "--", "sh", "-c", "trap '' TERM; sleep 300 & wait")
		rec := r.WaitState(t, statusfile.Running)
		runtest.Eventually(t, "group populated", func() bool { return len(runtest.Members(rec.PGID)) == 2 })
		endLease(t, root, r)
		r.WaitState(t, statusfile.Cancelling)
		unix.Kill(rec.WrapperPID, unix.SIGSTOP)
		if got := r.MustStatus(t); got.State != statusfile.Cancelling || len(runtest.Members(rec.PGID)) != 2 {
			t.Fatalf("the wrapper was not stopped within its %v grace (state %s): the machine is too slow for this test", grace, got.State)
		}
		check(t, root, c, r, rec, "deadline_expired", grace, 124)
	})
}

// A `cancel` killed (SIGKILL, by strace, at its first pidfd_send_signal)
// after it recorded `cancelling` and before it signalled the wrapper
// leaves a run without a lease cancelling, its wrapper unaware: the
// watchdog finishes the stop within the intent + grace + interval +
// ActAfter, and the wrapper exits with the record's code.
func TestWatchdogFinishesAKilledCancel(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	root := runtest.NewRoot(t)
	const grace, interval = time.Second, time.Second
	c, r := startRun(t, root, "nolease", "--lease", "0", "--grace", grace.String(), "nolease", "--", "sh", "-c", "sleep 300 & wait")
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "group populated", func() bool { return len(runtest.Members(rec.PGID)) == 2 })
	s := underStrace(t, root, []string{"-e", "trace=pidfd_send_signal", "-e", "inject=pidfd_send_signal:signal=SIGKILL:when=1"}, "cancel", "nolease")
	s.wait(t)
	if got := r.MustStatus(t); got.State != statusfile.Cancelling || len(runtest.Members(rec.PGID)) != 2 || c.Exited() {
		t.Fatalf("after the killed cancel: state %s, group %v, wrapper exited %v; want cancelling, the job alive\n%s", got.State, runtest.Members(rec.PGID), c.Exited(), s.out.String())
	}

	wd := runtest.Start(t, root, "watchdog", "--interval", interval.String())
	final := r.WaitState(t, statusfile.Cancelled)
	endedWithin(t, final, at(t, r, "cancel_requested"), grace+interval+watchdog.ActAfter+slack, "the intent")
	if final.Cause != statusfile.CauseCancel {
		t.Errorf("cause %s, want cancel (the recorded intent's)", final.Cause)
	}
	r.AssertGroupEmpty(t)
	if code := c.Wait(t); code != 143 {
		t.Errorf("the wrapper's exit %d, want 143", code)
	}
	runtest.Eventually(t, "the watchdog to report the stop", func() bool {
		return actions(t, lines(wd.Stdout.String()))["nolease"].Action == "stopped"
	})
}

// A watchdog service that is stopped (SIGSTOP) while it holds the root's
// lock is passed over: `watchdog --once` says so, naming its PID, and
// stops the run it would have stopped.
func TestStoppedWatchdogIsPassedOver(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	w1 := runtest.Start(t, root, "watchdog", "--interval", "1s")
	runtest.Eventually(t, "the service to hold the root's lock", func() bool {
		for _, pid := range lockHolders(root + "/" + watchdog.LockFile) {
			if pid == w1.Process.Pid {
				return true
			}
		}
		return false
	})
	unix.Kill(w1.Process.Pid, unix.SIGSTOP)
	runtest.Eventually(t, "the service to be stopped", func() bool {
		st, err := proc.ReadStat(w1.Process.Pid)
		return err == nil && st.State == 'T'
	})

	r, _ := orphanWith(t, root, "orphan", []string{"--grace", "1s"}, 2, "sh", "-c", "sleep 300 & wait")
	expireLease(t, root, r)

	code, out, errOut := aw(t, root, "watchdog", "--once")
	if code != 0 || actions(t, out)["orphan"].Action != "stopped" {
		t.Fatalf("watchdog --once beside a stopped one: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "pid "+strconv.Itoa(w1.Process.Pid)) || !strings.Contains(errOut, "passing it over") {
		t.Errorf("stderr %q; want it to say the stopped watchdog (pid %d) is passed over", errOut, w1.Process.Pid)
	}
	r.AssertGroupEmpty(t)
}

// The service's passes do not wait for its stops: while it stops a-long
// (a 15 s grace, TERM ignored), b-short's lease ends and b-short is
// stopped within its deadline + grace + interval + ActAfter.
func TestWatchdogServiceLooksOnDuringALongStop(t *testing.T) {
	t.Parallel() // waits on leases and graces, not the CPU
	root := runtest.NewRoot(t)
	const long, short, interval = 15 * time.Second, time.Second, time.Second
	a, b := orphanedPair(t, root, long, short)
	wd := runtest.Start(t, root, "watchdog", "--interval", interval.String())
	endLease(t, root, a)
	a.WaitState(t, statusfile.Cancelling) // the watchdog is in a-long's grace
	dl := endLease(t, root, b)
	rb := b.WaitState(t, statusfile.Cancelled)
	endedWithin(t, rb, dl, short+interval+watchdog.ActAfter+slack, "its deadline")
	b.AssertGroupEmpty(t)
	if ra := a.MustStatus(t); ra.State != statusfile.Cancelling {
		t.Errorf("a-long is %s when b-short ended, want still cancelling (in its %v grace)", ra.State, long)
	}
	a.WaitState(t, statusfile.Cancelled)
	a.AssertGroupEmpty(t)
	runtest.Eventually(t, "the watchdog to report both stops", func() bool {
		acts := actions(t, lines(wd.Stdout.String()))
		return acts["a-long"].Action == "stopped" && acts["b-short"].Action == "stopped"
	})
}

// Without a cgroup, a job that leaves its session while its wrapper is
// stopped (SIGSTOP) has no recorded escape: the stop from outside still
// finds it, a child of a member by its parent, an orphan by the stopped
// wrapper that holds it as subreaper, and stops both with the session.
func TestStoppedWrapperUnrecordedEscapesStopped(t *testing.T) {
	t.Parallel() // waits on a grace, not the CPU
	root := runtest.NewRoot(t)
	dir := t.TempDir()
	a, b, gate := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "go")
	job := `while [ ! -e "$3" ]; do sleep 0.05; done
setsid sh -c 'echo $$ > "$1"; exec sleep 301' sh "$1" &
sh -c 'setsid sh -c "echo \$\$ > \"\$1\"; exec sleep 302" sh "$1" &' sh "$2"
wait`
	c, r := startRun(t, root, "unrec", "--cgroup", "off", "--lease", "5m", "--grace", "1s", "unrec", "--", "sh", "-c", job, "sh", a, b, gate)
	rec := r.WaitState(t, statusfile.Running)
	r.StopOutsideLock(t, rec.WrapperPID)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	escapee := func(file string) proc.Stat {
		var st proc.Stat
		runtest.Eventually(t, "the escape in "+file, func() bool {
			b, err := os.ReadFile(file)
			if err != nil {
				return false
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return false
			}
			s, err := proc.ReadStat(pid)
			if err != nil || s.SID != pid {
				return false
			}
			st = s
			return true
		})
		return st
	}
	ea, eb := escapee(a), escapee(b)
	t.Cleanup(func() {
		for _, e := range []proc.Stat{ea, eb} {
			if proc.Alive(e.PID, e.Start) {
				unix.Kill(e.PID, unix.SIGKILL)
			}
		}
	})
	runtest.Eventually(t, "the orphan to reach the stopped wrapper", func() bool {
		s, err := proc.ReadStat(eb.PID)
		return err == nil && s.PPID == rec.WrapperPID
	})
	if got := r.MustStatus(t); len(got.Escaped) != 0 {
		t.Fatalf("the stopped wrapper recorded escapes %v: the test needs them unrecorded", got.Escaped)
	}
	if code, out, errOut := aw(t, root, "cancel", "--wait", "1s", "unrec"); code != 1 {
		t.Fatalf("cancel of a run with a stopped wrapper: exit %d, want 1 (not confirmed)\n%s%s", code, out, errOut)
	}
	runtest.Start(t, root, "watchdog", "--interval", "1s")
	r.WaitState(t, statusfile.Cancelled)
	for _, e := range []proc.Stat{ea, eb} {
		if !runtest.Within(10*time.Second, func() bool { return !proc.Alive(e.PID, e.Start) }) {
			t.Errorf("pid %d (sid %d, parent %d) outlived the cancel of its run", e.PID, e.SID, e.PPID)
		}
	}
	r.AssertGroupEmpty(t)
	unix.Kill(rec.WrapperPID, unix.SIGCONT)
	c.Wait(t)
}
