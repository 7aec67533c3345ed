package stop

import (
	"fmt"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// CompleteWait is how long a process that finds a run over waits for the
// journal's lock to complete its journal (CompleteJournal): a holder still
// stuck is not waited for; the watchdog's next pass tries again.
const CompleteWait = time.Second

// CompleteJournal appends the lines a stop could not journal to a run whose
// record is terminal and says its intent went unrecorded, but whose journal
// has no final line: a stop that went ahead while a stuck process held the
// journal's lock (Options.Bypass) wrote its final record, but neither its
// intent nor its final line. Under the run's lock and then the journal's
// (each waited for at most wait; 0: rundir.LockWait), so that no writer of
// a final record is between its record and its final line, and only if the
// journal still has no final line, it appends intent_unrecorded when the
// journal does not say so yet, then the final line, both from the record
// (the final line with its ended_at) and marked late, by naming who
// appended them. The record is not touched:
// it stays the stop's. It returns whether it appended; any other run is
// left as it is.
func CompleteJournal(d *rundir.Dir, by string, wait time.Duration) (bool, error) {
	rec, err := statusfile.Read(d)
	if err != nil || !statusfile.Terminal(rec.State) || !rec.IntentUnrecorded || journaled(d, "final") {
		return false, nil
	}
	if wait <= 0 {
		wait = rundir.LockWait
	}
	unlock, err := d.LockWithin(wait)
	if err != nil {
		return false, fmt.Errorf("run %s: cannot complete the journal: %w", d.ID, err)
	}
	defer unlock()
	if rec, err = statusfile.Read(d); err != nil {
		return false, nil
	}
	w, err := journal.Open(d)
	if err != nil {
		return false, fmt.Errorf("run %s: cannot complete the journal: %w", d.ID, err)
	}
	defer w.Close()
	w.LockWait = wait
	done := false
	err = w.Locked(func(add func(string, journal.Fields, bool) (int64, error)) error {
		if journaled(d, "final") {
			return nil // another process completed it first
		}
		if !journaled(d, "intent_unrecorded") {
			if _, err := add("intent_unrecorded", journal.Fields{"by": by, "cause": rec.Cause, "late": true}, false); err != nil {
				return err
			}
		}
		survivors := rec.Survivors
		if survivors == nil {
			survivors = []int{}
		}
		f := journal.Fields{"state": rec.State, "cause": rec.Cause, "exit_code": rec.Code(), "survivors": survivors, "by": by, "late": true, "ended_at": rec.EndedAt}
		if rec.SurvivorsUnknown() {
			f["survivors"] = nil
		}
		if rec.Containment != "" {
			f["containment"] = rec.Containment
		}
		if _, err := add("final", f, true); err != nil {
			return err
		}
		done = true
		return nil
	})
	if err != nil {
		return done, fmt.Errorf("run %s: cannot complete the journal: %w", d.ID, err)
	}
	return done, nil
}

// appendFinal appends a stop's final line under the journal's lock unless
// the journal has one already: a holder of the run's lock that woke while a
// stop that bypassed it was between its final record and its final line
// may have appended it late (CompleteJournal).
func (o Options) appendFinal(d *rundir.Dir, f journal.Fields) error {
	w, err := journal.Open(d)
	if err != nil {
		return fmt.Errorf("journal final: %w", err)
	}
	defer w.Close()
	w.LockWait = o.journalWait
	return w.Locked(func(add func(string, journal.Fields, bool) (int64, error)) error {
		if journaled(d, "final") {
			return nil
		}
		_, err := add("final", f, true)
		return err
	})
}

// journaled reports whether the run's journal has a line with event (read
// backwards: a final line is near the end).
func journaled(d *rundir.Dir, event string) bool {
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	_, ok := journal.Last(f, fi.Size(), event)
	return ok
}
