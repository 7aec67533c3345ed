package stop_test

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// stoppedRun makes what a stop that bypassed a stuck holder of the
// journal's lock leaves: a journal without the stop's lines, and a final
// `cancelled` record that says its intent went unrecorded.
func stoppedRun(t *testing.T) *rundir.Dir {
	t.Helper()
	d := runtest.RunDir(t, "complete-1")
	for _, ev := range []string{"created", "started"} {
		if _, err := journal.Append(d, ev, nil, false); err != nil {
			t.Fatal(err)
		}
	}
	rec := &statusfile.Record{RunID: d.ID, State: statusfile.Cancelled, Cause: statusfile.CauseLease, Survivors: []int{},
		Containment: statusfile.ContainmentCgroup, IntentUnrecorded: true, Command: []string{"sleep", "600"},
		CreatedAt: statusfile.Timestamp(time.Now()), EndedAt: statusfile.Timestamp(time.Now()), LeaseSeconds: 1, GraceSeconds: 1}
	rec.SetExit(statusfile.CauseExitCode(statusfile.CauseLease))
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
	return d
}

func events(t *testing.T, d *rundir.Dir) []journal.Entry {
	t.Helper()
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := journal.Verify(f); err != nil {
		t.Fatalf("the journal does not verify: %v", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	es, err := journal.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// While another open file holds the journal's lock, CompleteJournal gives
// up within its wait, naming the holder, and appends nothing; once the lock
// is free, eight callers at once, each with its own descriptor, append the missing
// intent_unrecorded and final lines exactly once, late, from the record,
// and the journal still chains.
func TestCompleteJournalAppendsOnceUnderTheLock(t *testing.T) {
	d := stoppedRun(t)
	held, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done, err := stop.CompleteJournal(d, "test", 100*time.Millisecond)
	var he *rundir.HeldError
	if done || !errors.As(err, &he) {
		t.Fatalf("CompleteJournal under a held lock: %v, %v; want false and a HeldError", done, err)
	}
	if es := events(t, d); len(es) != 2 {
		t.Fatalf("journal after the refused completion: %d lines, want 2", len(es))
	}
	unix.Flock(int(held.Fd()), unix.LOCK_UN)

	var wg sync.WaitGroup
	var mu sync.Mutex
	appended := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := stop.CompleteJournal(d, "test", 5*time.Second)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				appended++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if appended != 1 {
		t.Errorf("%d callers appended, want 1", appended)
	}
	es := events(t, d)
	if len(es) != 4 || es[2].Event != "intent_unrecorded" || es[3].Event != "final" {
		t.Fatalf("journal: %v; want created, started, intent_unrecorded, final", es)
	}
	f := es[3].Fields
	if f["late"] != true || f["by"] != "test" || f["state"] != statusfile.Cancelled || f["cause"] != statusfile.CauseLease ||
		f["exit_code"] != float64(statusfile.CauseExitCode(statusfile.CauseLease)) || f["containment"] != statusfile.ContainmentCgroup {
		t.Errorf("final line %v", f)
	}
	if rec, err := statusfile.Read(d); err != nil || f["ended_at"] != rec.EndedAt {
		t.Errorf("final line's ended_at %v, want the record's (%v)", f["ended_at"], err)
	}
	if s, ok := f["survivors"].([]any); !ok || len(s) != 0 {
		t.Errorf("final line's survivors %v, want []", f["survivors"])
	}
	if es[2].Fields["late"] != true || es[2].Fields["cause"] != statusfile.CauseLease {
		t.Errorf("intent_unrecorded line %v", es[2].Fields)
	}
}

// A run that is not over, whose record does not say its intent went
// unrecorded, or whose journal has its final line, is left as it is; so is
// one whose run's lock is held (a writer between its final record and its
// final line holds it).
func TestCompleteJournalLeavesACompleteOrLiveRun(t *testing.T) {
	d := stoppedRun(t)
	if _, err := journal.Append(d, "final", journal.Fields{"state": statusfile.Cancelled}, true); err != nil {
		t.Fatal(err)
	}
	if done, err := stop.CompleteJournal(d, "test", time.Second); done || err != nil {
		t.Errorf("a journal with its final line: %v, %v; want false, nil", done, err)
	}
	if n := len(events(t, d)); n != 3 {
		t.Errorf("%d lines, want 3", n)
	}

	d = stoppedRun(t)
	rec, err := statusfile.Read(d)
	if err != nil {
		t.Fatal(err)
	}
	rec.State, rec.EndedAt = statusfile.Cancelling, ""
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
	if done, err := stop.CompleteJournal(d, "test", time.Second); done || err != nil {
		t.Errorf("a cancelling run: %v, %v; want false, nil", done, err)
	}
	if n := len(events(t, d)); n != 2 {
		t.Errorf("%d lines, want 2", n)
	}

	d = stoppedRun(t)
	if rec, err = statusfile.Read(d); err != nil {
		t.Fatal(err)
	}
	rec.IntentUnrecorded = false
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
	if done, err := stop.CompleteJournal(d, "test", time.Second); done || err != nil {
		t.Errorf("a record whose intent is on record: %v, %v; want false, nil", done, err)
	}
	if n := len(events(t, d)); n != 2 {
		t.Errorf("%d lines, want 2", n)
	}

	d = stoppedRun(t)
	unlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	done, err := stop.CompleteJournal(d, "test", 100*time.Millisecond)
	unlock()
	var he *rundir.HeldError
	if done || !errors.As(err, &he) {
		t.Errorf("under a held run's lock: %v, %v; want false and a HeldError", done, err)
	}
	if n := len(events(t, d)); n != 2 {
		t.Errorf("%d lines, want 2", n)
	}
}
