package lease

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func TestParseDeadline(t *testing.T) {
	if v, err := ParseDeadline([]byte("1796210060\n")); err != nil || v != 1796210060 {
		t.Fatalf("%d %v", v, err)
	}
	for _, bad := range []string{"", "\n", "-1\n", "12a\n", "1.5\n", " 12\n", "12\n\n", "99999999999999999999\n"} {
		if _, err := ParseDeadline([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestDeadlineRoundsUp(t *testing.T) {
	now := time.Unix(1000, 200_000_000)
	if got := DeadlineAfter(now, 2*time.Second); got != 1003 {
		t.Errorf("1000.2 + 2s: %d, want 1003 (never shorter than asked)", got)
	}
	if got := DeadlineAfter(time.Unix(1000, 0), 2*time.Second); got != 1002 {
		t.Errorf("1000 + 2s: %d, want 1002", got)
	}
}

func runDir(t *testing.T, state string, deadline int64, lease float64) *rundir.Dir {
	t.Helper()
	r, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	d, _ := r.Create("l")
	t.Cleanup(func() { d.Close() })
	rec := &statusfile.Record{RunID: "l", State: state, Cause: "", LeaseSeconds: lease}
	if statusfile.Terminal(state) {
		rec.SetExit(0)
	}
	if state == statusfile.Cancelling {
		rec.Cause = statusfile.CauseCancel
	}
	if err := statusfile.Write(d, rec, false); err != nil {
		t.Fatal(err)
	}
	if deadline != 0 {
		WriteDeadline(d, deadline)
	}
	return d
}

func TestRenew(t *testing.T) {
	future := time.Now().Add(time.Hour).Unix()
	d := runDir(t, statusfile.Running, future, 60)
	next, err := Renew(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := DeadlineAfter(time.Now(), time.Minute); next < want-1 || next > want {
		t.Errorf("renewed to %d, want about now + the run's 60 s lease (%d)", next, want)
	}
	if got, _ := ReadDeadline(d); got != next {
		t.Errorf("file holds %d, want %d", got, next)
	}
	for name, tc := range map[string]struct {
		d    *rundir.Dir
		want string
	}{
		"finished":   {runDir(t, statusfile.Finished, future, 60), "finished"},
		"cancelling": {runDir(t, statusfile.Cancelling, future, 60), "being stopped"},
		"expired":    {runDir(t, statusfile.Running, time.Now().Add(-time.Second).Unix(), 60), "never revived"},
		"no lease":   {runDir(t, statusfile.Running, 0, 0), "no lease"},
	} {
		_, err := Renew(tc.d, time.Minute)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrRefused mentioning %q", name, err, tc.want)
		}
	}
}

// The journal's last deadline is the lease: a deadline_epoch written by
// hand, later, is ignored with a note, and renew refuses a run whose
// journal says it expired whatever the file says; an earlier file, or an
// unreadable one, is noted too, the earlier deadline standing.
func TestEffectiveIsTheJournals(t *testing.T) {
	past := time.Now().Add(-time.Minute).Unix()
	later := time.Now().Add(time.Hour).Unix()
	d := runDir(t, statusfile.Running, later, 60)
	if _, err := journal.Append(d, "started", journal.Fields{"pid": 10, "deadline_epoch": past}, false); err != nil {
		t.Fatal(err)
	}
	dl, note, err := Effective(d)
	if err != nil || dl != past || !strings.Contains(note, "ignored") {
		t.Fatalf("Effective: %d %q %v; want %d and a note", dl, note, err, past)
	}
	if _, err := Renew(d, time.Minute); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "never revived") {
		t.Fatalf("Renew of a lease expired by the journal: %v", err)
	}
	// A renewal is journaled, then written: both agree, no note.
	d2 := runDir(t, statusfile.Running, later, 60)
	journal.Append(d2, "started", journal.Fields{"deadline_epoch": later}, false)
	next, err := Renew(d2, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if dl, note, err := Effective(d2); err != nil || dl != next || note != "" {
		t.Fatalf("after Renew: %d %q %v; want %d", dl, note, err, next)
	}
	// An earlier deadline_epoch stands; an unreadable one is ignored.
	WriteDeadline(d2, past)
	if dl, note, _ := Effective(d2); dl != past || note == "" {
		t.Fatalf("earlier file: %d %q", dl, note)
	}
	d2.WriteAtomic(rundir.DeadlineFile, []byte("soon\n"), rundir.Visible)
	if dl, note, err := Effective(d2); err != nil || dl != next || !strings.Contains(note, "unreadable") {
		t.Fatalf("unreadable file: %d %q %v", dl, note, err)
	}
	// Started without a lease: a deadline_epoch revives nothing either.
	d3 := runDir(t, statusfile.Running, later, 0)
	journal.Append(d3, "started", journal.Fields{"deadline_epoch": 0}, false)
	if _, note, err := Effective(d3); !errors.Is(err, ErrNoDeadline) || note == "" {
		t.Fatalf("no lease: %q %v", note, err)
	}
}
