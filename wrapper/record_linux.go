package wrapper

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// finish writes the final record: `finished` with the leader's code, or
// `cancelled` with the cause's code, with what the end of the stop could
// vouch for (containment) and the survivors it saw. A record already made
// terminal by someone else (the watchdog or cancel, after deciding we had
// stopped acting) is never overwritten.
func (s *supervisor) finish(cause, containment string, survivors []int) *Result {
	if survivors == nil {
		survivors = []int{}
	}
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (writing the final record anyway)", err)
	} else {
		defer unlock()
	}
	disk := s.readRecord()
	if disk != nil {
		if statusfile.Terminal(disk.State) {
			return &Result{Record: disk, Code: disk.Code()}
		}
		if disk.State == statusfile.Cancelling && cause == "" {
			cause = disk.Cause
		}
	}
	r := &s.rec
	r.EndedAt = statusfile.Timestamp(time.Now())
	r.Survivors, r.Containment = survivors, containment
	if s.reap.exit.Signal != 0 {
		r.Signal = proc.SignalName(s.reap.exit.Signal)
	}
	if cause != "" {
		r.State, r.Cause = statusfile.Cancelled, cause
		r.SetExit(statusfile.CauseExitCode(cause))
	} else {
		r.State = statusfile.Finished
		r.SetExit(s.reap.exit.Code)
	}
	f := journal.Fields{"state": r.State, "exit_code": r.Code(), "survivors": survivors, "containment": containment}
	if r.SurvivorsUnknown() {
		f["survivors"] = nil
	}
	if r.Cause != "" {
		f["cause"] = r.Cause
	}
	if r.Signal != "" {
		f["signal"] = r.Signal
	}
	if r.IntentUnrecorded {
		// The stop went ahead without its intent on record; say so in
		// the journal now, if it can be written again.
		s.journal("intent_unrecorded", journal.Fields{"cause": r.Cause, "by": "wrapper"}, false)
	}
	if s.replaceRecord(disk, true) {
		// The journal's final line follows a final record that landed,
		// never one that did not (they must not tell two stories).
		s.journal("final", f, false)
	}
	out := *r
	return &Result{Record: &out, Code: r.Code()}
}

// writeRecord replaces status.json under the run's lock, and reports
// whether it was written.
func (s *supervisor) writeRecord(durable bool) bool {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v", err)
		return s.writeRecordLocked(durable)
	}
	defer unlock()
	return s.writeRecordLocked(durable)
}

// writeRecordLocked replaces status.json; the caller holds the lock. A
// cancel recorded by another process (state cancelling) is kept, and a
// terminal record is never replaced.
func (s *supervisor) writeRecordLocked(durable bool) bool {
	return s.replaceRecord(s.readRecord(), durable)
}

// readRecord reads status.json as it is on disk; nil if it cannot be read.
func (s *supervisor) readRecord() *statusfile.Record {
	disk, err := statusfile.Read(s.d)
	if err != nil {
		return nil
	}
	return disk
}

// replaceRecord is writeRecordLocked for a caller that has just read the
// record on disk (nil: unreadable) under the lock it still holds, so the
// record is not read twice.
// It reports whether the record was written.
func (s *supervisor) replaceRecord(disk *statusfile.Record, durable bool) bool {
	if disk != nil {
		if statusfile.Terminal(disk.State) {
			return false
		}
		if disk.State == statusfile.Cancelling && s.rec.State == statusfile.Running {
			s.rec.State, s.rec.Cause = disk.State, disk.Cause
		}
	}
	if err := statusfile.WriteMarked(s.d, &s.rec, durable, s.journalTail()); err != nil {
		s.warn("cannot write status.json (state %s): %v", s.rec.State, err)
		return false
	}
	return true
}

// journal appends an event to the run's journal; a failure is reported on
// Diag, and the run goes on.
func (s *supervisor) journal(event string, f journal.Fields, sync bool) {
	if err := s.appendJournal(event, f, sync); err != nil {
		s.warn("cannot journal %s: %v", event, err)
	}
}

// journalTail is the journal's mark for the next record: through the
// run's open journal (journal.Writer.Tail), read back only when another
// process appended since the wrapper's last line.
func (s *supervisor) journalTail() journal.Mark {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.jw == nil {
		return journal.Tail(s.d)
	}
	return s.jw.Tail()
}

func (s *supervisor) closeJournal() {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.jw != nil {
		s.jw.Close()
		s.jw = nil
	}
}

// writeFirstRecords writes the deadline (when the run has a lease) and the
// `starting` record, under the run's lock. The run directory is new and
// ours, so nothing is read first, and the deadline is a plain new file (no
// temp file, no rename, no fsync): it is complete before the record that
// makes the run visible to the watchdog, status and list exists, and
// reconcile reads both under the lock. The record is synced before its
// rename (see statusfile.Write). An error means the run cannot be recorded
// (a full disk): the claim is then undone, and no job starts.
func (s *supervisor) writeFirstRecords(deadline int64) error {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v", err)
	} else {
		defer unlock()
	}
	if deadline > 0 {
		if err := s.d.WriteOnce(rundir.DeadlineFile, lease.FormatDeadline(deadline)); err != nil {
			return fmt.Errorf("cannot write deadline_epoch: %w", err)
		}
	}
	if err := statusfile.WriteMarked(s.d, &s.rec, false, s.journalTail()); err != nil {
		return fmt.Errorf("cannot write status.json (state %s): %w", s.rec.State, err)
	}
	return nil
}

// reserveJournal opens the run's journal and reserves the space a stop's
// lines need (journal.Writer.Reserve), so that a disk the job fills cannot
// silence its stop. On a file system that cannot reserve at all (no
// fallocate) the run goes on, and its created line says so (not stderr:
// that is the job's stream); one that is full fails the claim. It returns
// what the created line should say about the reserve.
func (s *supervisor) reserveJournal() (string, error) {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.jw == nil {
		w, err := journal.Open(s.d)
		if err != nil {
			return "", err
		}
		s.jw = w
	}
	err := s.jw.Reserve()
	if err != nil && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)) {
		return "unsupported by the file system", nil
	}
	if err != nil {
		return "", err
	}
	return strconv.Itoa(journal.ReserveBytes), nil
}

// appendJournal is the wrapper's one way to the journal: through the run's
// events.jsonl, opened at the first event and kept open until the run ends
// (closeJournal).
func (s *supervisor) appendJournal(event string, f journal.Fields, sync bool) error {
	_, err := s.appendJournalSeq(event, f, sync)
	return err
}

// appendJournalSeq is appendJournal returning the event's seq.
func (s *supervisor) appendJournalSeq(event string, f journal.Fields, sync bool) (int64, error) {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.jw == nil {
		w, err := journal.Open(s.d)
		if err != nil {
			return 0, err
		}
		s.jw = w
	}
	return s.jw.Append(event, f, sync)
}

func (s *supervisor) warn(format string, a ...any) {
	fmt.Fprintf(s.diag, "agent-wrap: run %s: "+format+"\n", append([]any{s.cfg.ID}, a...)...)
}
