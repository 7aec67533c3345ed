package wrapper

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// wait blocks until the leader exits (returns "") or the run must be
// cancelled (returns the cause).
func (s *supervisor) wait(deadline int64) string {
	var leaseC <-chan time.Time
	var timer *time.Timer
	if deadline > 0 {
		timer = time.NewTimer(time.Until(time.Unix(deadline, 0)))
		defer timer.Stop()
		leaseC = timer.C
	}
	// A backstop look finds escaped descendants and reaps orphans even if
	// a SIGCHLD was coalesced with another: every lookEvery while the run
	// changes, backing off to lookEveryQuiet while it does not (see
	// nextLook).
	period := lookEvery
	tick := time.NewTicker(period)
	defer tick.Stop()
	seen := deadline // deadline_epoch as last read
	var seenStamp rundir.Stamp

	if s.pollLeader() {
		return s.cancelledMeanwhile()
	}
	for {
		select {
		case sig := <-s.sigs:
			switch sig {
			case unix.SIGCHLD:
				if s.pollLeader() {
					return s.cancelledMeanwhile()
				}
				s.reap.reapOthers()
			case unix.SIGPIPE:
				// A closed stream: the streamer has seen the error already.
			case unix.SIGHUP:
				if s.cfg.OnHangup == HangupIgnore {
					s.journal("hangup_ignored", nil, false)
					continue
				}
				return s.beginCancel(statusfile.CauseHUP, "cancel_requested")
			case unix.SIGTERM:
				return s.beginCancel(statusfile.CauseTERM, "cancel_requested")
			case unix.SIGINT:
				return s.beginCancel(statusfile.CauseINT, "cancel_requested")
			}
		case n := <-s.stdinLost():
			return s.loseStdin(n)
		case <-s.controlChanged():
			s.recordHandoffs()
		case <-leaseC:
			next, expired := s.checkLease()
			if expired != "" {
				return expired
			}
			deadline = next
			timer.Reset(time.Until(time.Unix(next, 0)))
		case <-tick.C:
			if s.dirGone() {
				// Its ID is free while the job runs: the record, journal
				// and lease are gone with the directory, so nothing could
				// find, renew or stop it. It stops now.
				s.warn("the run directory %s was removed while the job ran: stopping the job", s.d.Path)
				return s.beginCancel(statusfile.CauseCancel, "run_dir_removed")
			}
			quiet := s.look() // records escapes
			if s.pollLeader() {
				return s.cancelledMeanwhile()
			}
			// A renewal may also shorten the lease (renew --lease 1s ends
			// a run on demand): the timer is moved up to the new deadline,
			// where checkLease decides under the lock. The file is the
			// cheap look, and while its stamp (inode, size, times) is as
			// last seen, one fstatat is all of it; when it changes, the
			// journal says what the deadline is (lease.Effective), so a
			// hand-written file moves nothing later.
			if timer != nil {
				stamp, serr := s.d.StampOf(rundir.DeadlineFile)
				moved := serr != nil || stamp != seenStamp
				seenStamp = stamp
				if moved {
					if dl, err := lease.ReadDeadline(s.d); err == nil && dl != seen {
						seen, quiet = dl, false
						if eff, _, err := lease.Effective(s.d); err == nil && eff < deadline {
							deadline = eff
							timer.Reset(time.Until(time.Unix(eff, 0)))
							s.deadlineMoved(eff)
						}
					}
				}
			}
			if next := nextLook(period, quiet); next != period {
				// Only a change of period touches the ticker: a reset
				// wakes the runtime's poller (one more thread woken), a
				// ticker left alone re-arms itself.
				period = next
				tick.Reset(period)
			}
		}
	}
}

// The backstop look's period: lookEvery while the run changes, doubling
// up to lookEveryQuiet after each look that found nothing of the run had
// run since the last one (and the deadline file unchanged). Nothing can
// escape without running, so the look after a quiet spell is the one
// that finds it: an escape is recorded at most lookEveryQuiet after it
// happened, one lookEvery while the job keeps running. A quiet run so
// costs its host half the wakeups; the lease needs no look (its timer
// is separate), and the watchdog backs a shortened deadline up.
const (
	lookEvery      = time.Second
	lookEveryQuiet = 2 * time.Second
)

func nextLook(period time.Duration, quiet bool) time.Duration {
	if !quiet {
		return lookEvery
	}
	return min(2*period, lookEveryQuiet)
}

// pollLeader asks the reaper, without reaping, whether the leader has
// exited, and journals its exit the one time it is first seen.
func (s *supervisor) pollLeader() bool {
	first, err := s.reap.pollLeader()
	if err != nil {
		s.warn("waitid(%d): %v", s.reap.leader, err)
		return false
	}
	if first {
		f := journal.Fields{"pid": s.reap.leader}
		if e := s.reap.exit; e.Signal != 0 {
			f["signal"] = proc.SignalName(e.Signal)
		} else {
			f["exit_code"] = e.Code
		}
		s.journal("leader_exited", f, false)
	}
	return s.reap.exited
}

// cancelledMeanwhile is called when the leader has exited: if a cancel was
// recorded before that (by the cancel command, which then TERMs us), the run
// still ends as cancelled, since that is what was asked and recorded.
func (s *supervisor) cancelledMeanwhile() string {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v", err)
		return ""
	}
	defer unlock()
	if disk, err := statusfile.Read(s.d); err == nil && disk.State == statusfile.Cancelling {
		s.rec.State, s.rec.Cause = disk.State, disk.Cause
		return disk.Cause
	}
	return ""
}

// beginCancel records the intent (journal, synced) and `cancelling`
// (durable) under the run's lock, before any signal is sent. If the run is
// already cancelling, the cause recorded first wins and is returned.
func (s *supervisor) beginCancel(cause, event string) string {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (stopping anyway)", err)
	} else {
		defer unlock()
	}
	return s.intend(event, cause, journal.Fields{"by": "wrapper", "pid": s.self})
}

// intend records the intent with stop.Intend; the caller holds the lock.
// The wrapper stops its job even when the intent cannot be journaled (it is
// the job's last line of defence), and says so.
func (s *supervisor) intend(event, cause string, f journal.Fields) string {
	disk := s.readRecord()
	cause, err := stop.Intend(s.d, &s.rec, disk, event, cause, f, s.appendJournal, func(*statusfile.Record) error {
		// Read again after the journal's fsync: a wrapper stopped there
		// may wake after the watchdog stopped the run without the lock,
		// and its final record stands (replaceRecord keeps it).
		s.replaceRecord(s.readRecord(), false) // warns itself
		return nil
	})
	if err != nil {
		s.warn("%v (stopping anyway)", err)
		if s.rec.State != statusfile.Cancelling {
			// Not journaled: the record says the stop went ahead without
			// its intent on record.
			s.rec.State, s.rec.Cause, s.rec.IntentUnrecorded = statusfile.Cancelling, cause, true
			s.writeRecordLocked(false)
		}
	}
	return cause
}

// checkLease runs when the deadline timer fires. Under the run's lock it
// rereads deadline_epoch: a renewal moved it (returns the new deadline), or
// it has passed, and the expiry is journaled and synced and `cancelling`
// written before anything is signalled (returns cause lease).
func (s *supervisor) checkLease() (int64, string) {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (enforcing the lease anyway)", err)
		return 0, s.expire(0)
	}
	defer unlock()
	disk, err := statusfile.Read(s.d)
	if err == nil && disk.State == statusfile.Cancelling && disk.Cause != "" {
		s.rec.State, s.rec.Cause = disk.State, disk.Cause
		return 0, disk.Cause
	}
	dl, note, err := lease.Effective(s.d)
	if note != "" {
		s.warn("%s", note)
	}
	if err != nil {
		s.warn("cannot read the run's deadline: %v (treating the lease as expired)", err)
		return 0, s.expire(0)
	}
	if time.Now().Before(time.Unix(dl, 0)) {
		return dl, ""
	}
	return 0, s.expire(dl)
}

// expire records the lease expiry; the caller holds the lock.
func (s *supervisor) expire(deadline int64) string {
	return s.intend("deadline_expired", statusfile.CauseLease, journal.Fields{"deadline_epoch": deadline, "by": "wrapper", "pid": s.self})
}

// dirGone reports whether the run directory the wrapper holds is no longer
// ROOT/RUN_ID: removed (rm -r), or renamed away.
func (s *supervisor) dirGone() bool {
	return !s.cfg.Root.Holds(s.d)
}
