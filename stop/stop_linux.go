package stop

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Options describe a stop performed from outside the wrapper.
type Options struct {
	Grace  time.Duration // between TERM and KILL
	Cause  string        // statusfile.CauseCancel or CauseLease, unless one is recorded already
	Intent string        // journal event for the intent: cancel_requested or deadline_expired
	By     string        // "cancel" or "watchdog", journaled
	Fields journal.Fields
	Diag   io.Writer
	// IntentUnrecorded says an earlier stop of this run went ahead while
	// its intent could not be journaled: the final record says so, and
	// the journal too.
	IntentUnrecorded bool
	// LockWait bounds each wait for the run's lock (0: rundir.LockWait).
	LockWait time.Duration
	// Bypass lets the stop go ahead without the run's lock when a holder
	// keeps it through LockWait, or at once when the holder is stopped
	// (SIGSTOP, a tracer's stop): a stuck agent-wrap process must not
	// keep a run alive past its lease. The watchdog sets it, for a run
	// whose deadline has passed. The stop then journals lock_bypassed,
	// naming the holder, and its final line says without_lock; a holder
	// that wakes afterwards finds the final record and changes nothing.
	Bypass bool

	journalWait time.Duration // each journal line's wait for its lock (0: rundir.LockWait)
}

// Report is what an outside stop did.
type Report struct {
	Record    *statusfile.Record // the final record (or the terminal one found)
	Signalled []int              // PIDs sent TERM or KILL
	Rejected  []string           // processes left alone, and why
	Already   bool               // the run was terminal before we acted
	// IntentUnrecorded: the intent could not be journaled, and the stop
	// went ahead anyway (the lease is the last word).
	IntentUnrecorded bool
	// WithoutLock names the holders of the run's lock when the stop went
	// ahead without it (Options.Bypass); nil when it had the lock.
	WithoutLock []rundir.Holder
}

// ErrRefused is returned (wrapped) when validation fails and nothing was
// signalled.
var ErrRefused = errors.New("refusing to signal")

// Outside performs the ordered stop of a run whose wrapper is gone (or has
// not acted): under the run's lock the intent is recorded (Intend), unless a
// cancel is already recorded (whose cause then stands); then the stop Loop
// over the run's members as membership judges them from outside, each
// signalled through a checked pidfd and waited for with PollWake; and under
// the lock again the final `cancelled` record with the survivors. A record
// already terminal is returned as it is; nothing is signalled then. A record
// that fails validation (another boot, an inconsistent group) is refused
// (ErrRefused), journaled as stop_refused, and nothing is signalled.
func Outside(d *rundir.Dir, o Options) (*Report, error) {
	if o.Diag == nil {
		o.Diag = io.Discard
	}
	rep := &Report{IntentUnrecorded: o.IntentUnrecorded}
	unlock, err := o.lock(d, rep)
	if err != nil {
		return nil, err
	}
	rec, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		unlock()
		return nil, err
	}
	if statusfile.Terminal(rec.State) {
		unlock()
		rep.Record, rep.Already = rec, true
		o.complete(d)
		return rep, nil
	}
	err = membership.Check(rec)
	if errors.Is(err, membership.ErrNoGroup) && adoptStarting(d, rec, o) {
		err = membership.Check(rec)
	}
	emptyCgroup := false
	if errors.Is(err, membership.ErrNoGroup) && rec.JobUnrecorded() && d.Exists(rundir.StdoutFile) {
		// The wrapper got as far as opening the job's logs, so the job may
		// have been started, and nothing says which process it is. An
		// empty cgroup of the run's proves that nothing of it runs;
		// without one, a `cancelled` record now could be a lie: leave the
		// run unknown.
		if emptyCgroup = membership.StartingCgroupEmpty(rec); !emptyCgroup {
			err = errors.New("its wrapper died while starting the job, after opening its logs and before recording its PID, and no process is left that the pid file, a cgroup or the job's stdout.log names: whether the job runs cannot be told, so the run is not recorded as stopped")
		}
	}
	if err != nil && !errors.Is(err, membership.ErrNoGroup) {
		o.journal(d, "stop_refused", journal.Fields{"by": o.By, "reason": err.Error()}, true)
		unlock()
		return nil, fmt.Errorf("run %s: %w: %v", d.ID, ErrRefused, err)
	}
	f := journal.Fields{"by": o.By}
	for k, v := range o.Fields {
		f[k] = v
	}
	if rec.Rebuilt {
		o.journal(d, "record_rebuilt", journal.Fields{"by": o.By, "state": rec.State, "pid": rec.PID}, false)
	}
	cause, err := Intend(d, rec, rec, o.Intent, o.Cause, f, o.appendLine(d, rep), writeRecord(d))
	switch {
	case errors.Is(err, errTakenOver):
		unlock()
		return o.takenOver(d, rep)
	case errors.Is(err, errNotJournaled):
		// The lease is the last word: a journal that cannot be written
		// (a read-only file system, or a stuck holder of the journal's
		// lock) does not keep the run alive. The record says the intent
		// went unrecorded, where it can be written.
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: %v; stopping anyway, and recording that the intent is not on record\n", d.ID, err)
		rec.State, rec.Cause, rec.IntentUnrecorded = statusfile.Cancelling, cause, true
		rep.IntentUnrecorded = true
		if werr := statusfile.Write(d, rec, false); werr != nil {
			fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot write the cancelling record either: %v\n", d.ID, werr)
		}
	case err != nil:
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: %v (stopping anyway)\n", d.ID, err)
	}
	unlock()
	rep.Record = rec
	if rec.PGID <= 1 {
		containment := ""
		if emptyCgroup {
			containment = statusfile.ContainmentCgroup
		}
		return finalize(d, rep, cause, containment, nil, o)
	}
	signalled := map[int]bool{}
	outside := membership.Run{Record: rec, Logs: membership.LogsOf(d)}
	haveCgroup := rec.Cgroup != "" && cgroup.Valid(rec.Cgroup)
	killCgroup := func(ps []int) {
		o.journal(d, "signal_sent", journal.Fields{"signal": "KILL", "target": "cgroup", "cgroup": rec.Cgroup, "pids": ps, "by": o.By}, false)
		if err := KillCgroup(rec.Cgroup); err != nil {
			fmt.Fprintf(o.Diag, "agent-wrap: run %s: cgroup.kill: %v (signalling each process instead)\n", d.ID, err)
		}
	}
	loop := Loop{
		Members: func() []membership.Member {
			ms, rejected, err := outside.Members()
			if err != nil {
				fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot read /proc: %v\n", d.ID, err)
			}
			rep.Rejected = appendNew(rep.Rejected, rejected)
			return ms
		},
		Signal: func(sig unix.Signal, ms []membership.Member, again bool) {
			if sig == unix.SIGKILL && haveCgroup {
				killCgroup(pids(ms))
			}
			o.journal(d, "signal_sent", journal.Fields{"signal": proc.SignalName(sig), "target": "validated", "pgid": rec.PGID, "pids": pids(ms), "by": o.By}, false)
			for _, m := range ms {
				signalled[m.PID] = true
				if err := Signal(m.Identity, sig); err != nil && !errors.Is(err, proc.ErrGone) {
					rep.Rejected = appendNew(rep.Rejected, []string{err.Error() + ": left alone"})
				}
			}
		},
		Wake: PollWake,
	}
	if haveCgroup {
		// The cgroup is the proof: cgroup.kill ends every stop that found
		// a member, and the stop is over when the kernel says the cgroup
		// holds no live process.
		loop.Sweep = func() { killCgroup([]int{}) }
		loop.Empty = func() bool {
			p, err := cgroup.Populated(rec.Cgroup)
			if err != nil {
				fmt.Fprintf(o.Diag, "agent-wrap: run %s: %v\n", d.ID, err)
			}
			return err == nil && !p
		}
	}
	if !haveCgroup {
		// Without a cgroup the run's logs are the proof that no process
		// a look missed still holds them (membership.Logs.Unheld); where
		// the kernel cannot tell, two empty looks are all there is.
		loop.Empty = func() bool {
			unheld, ok := outside.Logs.Unheld()
			return unheld || !ok
		}
	}
	res := loop.Run(o.Grace)
	survivors := res.Survivors
	// Without a cgroup, a stop from outside the wrapper sees the job's
	// session and the escapes the wrapper recorded, nothing else: a
	// process that left the session unrecorded (the wrapper was killed
	// before its next look) is invisible here, so the record cannot say
	// that nothing survived.
	containment := statusfile.ContainmentSession
	if haveCgroup && res.Proven {
		containment = statusfile.ContainmentCgroup
	}
	for pid := range signalled {
		rep.Signalled = append(rep.Signalled, pid)
	}
	sort.Ints(rep.Signalled)
	if len(rep.Rejected) > 0 {
		o.journal(d, "signal_refused", journal.Fields{"by": o.By, "reasons": rep.Rejected}, false)
	}
	if rec.Cgroup != "" && len(survivors) == 0 && cgroup.Valid(rec.Cgroup) {
		cgroup.Remove(rec.Cgroup)
	}
	return finalize(d, rep, cause, containment, survivors, o)
}

// journal appends an event; a failure is reported on Diag, as the wrapper
// reports its own.
func (o Options) journal(d *rundir.Dir, event string, f journal.Fields, sync bool) {
	if _, err := o.appendOne(d, event, f, sync); err != nil {
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot journal %s: %v\n", d.ID, event, err)
	}
}

// appendOne journals one line, waiting for the journal's lock at most
// o.journalWait.
func (o Options) appendOne(d *rundir.Dir, event string, f journal.Fields, sync bool) (int64, error) {
	w, err := journal.Open(d)
	if err != nil {
		return 0, fmt.Errorf("journal %s: %w", event, err)
	}
	defer w.Close()
	w.LockWait = o.journalWait
	return w.Append(event, f, sync)
}

// appendLine is Intend's journal for this stop: after the run's lock was
// bypassed (rep.WithoutLock), the journal's lock is waited for only
// briefly, since the stuck holder may hold it too.
func (o *Options) appendLine(d *rundir.Dir, rep *Report) func(string, journal.Fields, bool) error {
	if rep.WithoutLock != nil {
		o.journalWait = bypassJournalWait
	}
	return func(event string, f journal.Fields, sync bool) error {
		_, err := o.appendOne(d, event, f, sync)
		return err
	}
}

// A stop with Bypass first waits stoppedHolderWait for the run's lock, and
// goes ahead at once if its holder is stopped then; once it has bypassed
// the lock, it waits bypassJournalWait for the journal's at each line,
// since the stuck holder may hold that too.
const (
	bypassJournalWait = 100 * time.Millisecond
	stoppedHolderWait = 200 * time.Millisecond
)

// lock takes the run's lock for a stop: at most o.LockWait, and with
// o.Bypass, not at all when a holder keeps it through that wait, or is
// stopped. Going ahead without it is journaled (lock_bypassed, naming the
// holders) and rep.WithoutLock set; the unlock is then a no-op.
func (o *Options) lock(d *rundir.Dir, rep *Report) (unlock func(), err error) {
	wait := o.LockWait
	if wait <= 0 {
		wait = rundir.LockWait
	}
	var held *rundir.HeldError
	first := wait
	if o.Bypass {
		first = min(wait, stoppedHolderWait)
	}
	unlock, err = d.LockWithin(first)
	if errors.As(err, &held) && !held.Stopped() && wait > first {
		unlock, err = d.LockWithin(wait - first)
		if errors.As(err, &held) {
			held.Waited += first
		}
	}
	if err == nil {
		return unlock, nil
	}
	if !o.Bypass || !errors.As(err, &held) {
		return nil, fmt.Errorf("run %s: %w", d.ID, err)
	}
	if rep.WithoutLock == nil {
		rep.WithoutLock = held.Holders
		if rep.WithoutLock == nil {
			rep.WithoutLock = []rundir.Holder{}
		}
		o.journalWait = bypassJournalWait
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: %v; stopping the run without the lock (its lease is over)\n", d.ID, held)
		holders := make([]string, len(held.Holders))
		for i, h := range held.Holders {
			holders[i] = h.String()
		}
		o.journal(d, "lock_bypassed", journal.Fields{"by": o.By, "holders": holders, "waited_ms": held.Waited.Milliseconds()}, true)
	}
	// A holder stopped inside its replacement of the record must not
	// rename it over the one this stop writes, when it wakes.
	if removed, err := d.RemoveTemps(rundir.StatusFile); err != nil {
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: %v\n", d.ID, err)
	} else if len(removed) > 0 {
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: removed %v, the stuck holder's unfinished record\n", d.ID, removed)
	}
	return func() {}, nil
}

// takenOver is what a stop that finds the run's final record written
// meanwhile (by a stop that bypassed its stuck lock) reports: that record,
// untouched.
func (o Options) takenOver(d *rundir.Dir, rep *Report) (*Report, error) {
	rec, err := statusfile.Read(d)
	if err != nil {
		return nil, err
	}
	rep.Record, rep.Already = rec, true
	o.complete(d)
	return rep, nil
}

// complete appends the final line that a stop which bypassed a stuck holder
// could not journal (CompleteJournal), now that this process, the holder
// perhaps, finds the run over; a failure is reported on Diag, and left to
// the next watchdog pass.
func (o Options) complete(d *rundir.Dir) {
	if _, err := CompleteJournal(d, o.By, CompleteWait); err != nil {
		fmt.Fprintf(o.Diag, "agent-wrap: %v (the next watchdog pass tries again)\n", err)
	}
}

// finalize writes the final `cancelled` record with what the stop could
// vouch for (containment, "" when no process group was ever recorded, so
// nothing was looked for) and the survivors it saw.
func finalize(d *rundir.Dir, rep *Report, cause, containment string, survivors []int, o Options) (*Report, error) {
	if survivors == nil {
		survivors = []int{}
	}
	unlock, err := o.lock(d, rep)
	if err != nil {
		return rep, err
	}
	defer unlock()
	rec, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		return rep, err
	}
	if statusfile.Terminal(rec.State) {
		rep.Record = rec
		return rep, nil
	}
	rec.State, rec.Cause = statusfile.Cancelled, cause
	rec.SetExit(statusfile.CauseExitCode(cause))
	rec.Survivors, rec.Containment = survivors, containment
	rec.EndedAt = statusfile.Timestamp(time.Now())
	if rep.IntentUnrecorded {
		rec.IntentUnrecorded = true
		o.journal(d, "intent_unrecorded", journal.Fields{"by": o.By, "cause": cause, "signalled": rep.Signalled}, true)
	}
	if err := statusfile.Write(d, rec, true); err != nil {
		rep.Record = rec
		return rep, fmt.Errorf("run %s: stopped, but cannot write the final record: %w", d.ID, err)
	}
	// The final line follows a final record that landed, never one that
	// did not.
	f := journal.Fields{"state": rec.State, "cause": cause, "exit_code": rec.Code(), "survivors": survivors, "by": o.By}
	if containment != "" {
		f["containment"] = containment
	}
	if rec.SurvivorsUnknown() {
		f["survivors"] = nil
	}
	if rep.WithoutLock != nil {
		f["without_lock"] = true
	}
	if err := o.appendFinal(d, f); err != nil {
		fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot journal final: %v\n", d.ID, err)
	}
	rep.Record = rec
	return rep, nil
}

func appendNew(dst, src []string) []string {
	for _, s := range src {
		dup := false
		for _, x := range dst {
			if x == s {
				dup = true
				break
			}
		}
		if !dup {
			dst = append(dst, s)
		}
	}
	return dst
}
