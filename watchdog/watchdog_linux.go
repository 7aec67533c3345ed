// Package watchdog enforces leases when a run's wrapper cannot: it stops
// every run under a root whose deadline has passed and whose wrapper is dead
// or has not acted within ActAfter, and every run left `cancelling` past its
// grace by a wrapper or canceller that is stuck or gone, with the same
// ordered stop that cancel uses (stop.Outside). One watchdog runs per root
// (LockFile); one that is stopped or no longer at work is passed over.
//
// Pass is one look at every run; the stops it decides on run side by side
// (up to MaxStops at once), so one run's long grace delays no other run,
// and a stop goes ahead without a run's lock whose holder is stuck. Serve
// is the service around it, for cron (one pass) and systemd (a pass every
// interval): it holds the lock, prints each action as a JSON line and keeps
// the service manager told (Notifier, the sd_notify(3) client).
package watchdog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// ActAfter is how long past a deadline a live wrapper has to act on it
// before the watchdog stops the run itself, and how long past its grace a
// run may stay `cancelling` without a final record. The wrapper's own
// timer fires at the deadline; this covers a wrapper (or a cancel) that is
// stopped (SIGSTOP), wedged, starved or killed half way.
const ActAfter = 3 * time.Second

// LockFile is the root-level lock file that keeps one watchdog per root.
const LockFile = ".watchdog.lock"

// MaxStops is how many runs one watchdog stops at once; more wait their
// turn.
const MaxStops = 32

// StopLockWait is how long a watchdog's stop waits for a run's lock before
// it goes ahead without it (at once when the holder is stopped): the
// watchdog acts only on a run whose lease is over, and the lock is held
// for a few writes.
const StopLockWait = time.Second

// creating is how young a run directory without a record is taken to be
// one whose wrapper is creating it (it writes the first record a moment
// after the mkdir), and passed without a word.
const creating = 2 * time.Second

// Action is one thing a watchdog pass did or could not do, printed as one
// JSON line. Healthy runs produce no action.
type Action struct {
	RunID     string   `json:"run_id"`
	Action    string   `json:"action"` // stopped, refused, skipped
	Reason    string   `json:"reason"`
	Deadline  int64    `json:"deadline_epoch,omitempty"`
	State     string   `json:"state,omitempty"`
	Cause     string   `json:"cause,omitempty"`
	ExitCode  *int     `json:"exit_code,omitempty"`
	Signalled []int    `json:"signalled,omitempty"`
	Survivors []int    `json:"survivors,omitempty"`
	Rejected  []string `json:"rejected,omitempty"`
	// Note says what the watchdog disregarded: a deadline_epoch that
	// disagrees with the journal, a lease that could not be read.
	Note string `json:"note,omitempty"`
	// WithoutLock names the stuck holders of the run's lock when the stop
	// went ahead without it.
	WithoutLock []string `json:"without_lock,omitempty"`
}

// Options configure a pass.
type Options struct {
	Grace time.Duration // 0: each run's own grace_seconds
	Now   func() time.Time
	// Progress, if set, is called after each run is looked at, so a long
	// pass over many runs can keep a service manager's watchdog fed.
	Progress func()
	// Diag receives what a stop could not do on its way (a journal line it
	// could not write, say); nil discards it.
	Diag io.Writer

	// unrecorded holds the runs a pass stopped without their intent on
	// record and whose final record could not be written (a read-only
	// file system): a later pass of the same service records the gap
	// when it can write again. Serve sets it; nil remembers nothing.
	unrecorded *runSet
}

// A runSet is a set of run IDs that the stops' goroutines share. Its
// methods are no-ops on a nil set.
type runSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (r *runSet) has(id string) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[id]
}

func (r *runSet) set(id string, in bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if in {
		r.m[id] = true
	} else {
		delete(r.m, id)
	}
}

// Pass looks at every run under root once, stops side by side each whose
// deadline has passed and whose wrapper is dead, or alive but has not acted
// within ActAfter, and each left `cancelling` past its grace + ActAfter,
// waits for those stops and returns what was done, in run-ID order. A run
// that cannot be read is reported and skipped; a pass never stops on one
// bad run.
func Pass(root *rundir.Root, o Options) ([]Action, error) {
	var mu sync.Mutex
	var out []Action
	s := newStopper(o, func(a Action) { mu.Lock(); out = append(out, a); mu.Unlock() })
	err := s.pass(root)
	s.wait()
	sort.SliceStable(out, func(i, j int) bool { return out[i].RunID < out[j].RunID })
	return out, err
}

// A stopper looks at runs and stops those it must, each in a goroutine of
// its own; a run being stopped is not looked at again until its stop ends.
type stopper struct {
	o    Options
	emit func(Action) // called from the stops' goroutines too
	sem  chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	inflight map[string]bool
}

func newStopper(o Options, emit func(Action)) *stopper {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &stopper{o: o, emit: emit, sem: make(chan struct{}, MaxStops), inflight: map[string]bool{}}
}

// pass looks at every run once and starts the stops it decides on.
func (s *stopper) pass(root *rundir.Root) error {
	ids, err := root.List()
	if err != nil {
		return err
	}
	for _, id := range ids {
		s.mu.Lock()
		busy := s.inflight[id]
		s.mu.Unlock()
		if !busy {
			a, j := look(root, id, s.o)
			if a != nil {
				s.emit(*a)
			}
			if j != nil {
				s.start(root, j)
			}
		}
		if s.o.Progress != nil {
			s.o.Progress()
		}
	}
	return nil
}

// wait returns when every stop started has ended.
func (s *stopper) wait() { s.wg.Wait() }

func (s *stopper) start(root *rundir.Root, j *job) {
	s.mu.Lock()
	s.inflight[j.id] = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.sem <- struct{}{}
		a := j.stop(root, s.o)
		<-s.sem
		if a != nil {
			s.emit(*a)
		}
		s.mu.Lock()
		delete(s.inflight, j.id)
		s.mu.Unlock()
	}()
}

// A job is a stop decided on by look.
type job struct {
	id     string
	dl     int64 // the deadline (0: none, a cancel left half done)
	state  string
	grace  time.Duration
	reason string
	// note says what look disregarded (a deadline_epoch that disagrees
	// with the journal, a lease that could not be read).
	note string
	// rebuilt: the record was unreadable and was rebuilt from the
	// journal and the pid files.
	rebuilt bool
}

// completeWait is a pass's wait for a journal's lock to complete a run's
// journal: short, as the holder may still be stuck.
const completeWait = 100 * time.Millisecond

// look decides what to do with run id: nothing (nil, nil), an Action to
// print now (skipped), or a stop.
func look(root *rundir.Root, id string, o Options) (*Action, *job) {
	d, err := root.Open(id)
	if err != nil {
		return &Action{RunID: id, Action: "skipped", Reason: err.Error()}, nil
	}
	defer d.Close()
	// Terminal runs, most of a root, cost one read: the record.
	// An unreadable record is rebuilt from the run's other files (the
	// journal, pid, pgid): a torn status.json stops nobody's stop.
	rec, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && beingCreated(root, id) {
			return nil, nil // its wrapper writes the first record any moment now
		}
		return &Action{RunID: id, Action: "skipped", Reason: err.Error()}, nil
	}
	if statusfile.Terminal(rec.State) {
		// A stop that bypassed a stuck holder of the journal's lock could
		// not journal its intent (the record says so) nor its final line:
		// appended here, late, once the lock is free.
		if rec.IntentUnrecorded {
			if _, err := stop.CompleteJournal(d, "watchdog", completeWait); err != nil && o.Diag != nil {
				fmt.Fprintf(o.Diag, "agent-wrap: %v (the next pass tries again)\n", err)
			}
		}
		return nil, nil
	}
	grace := o.Grace
	if grace <= 0 {
		grace = time.Duration(rec.GraceSeconds * float64(time.Second))
	}
	// The journal's deadline: a hand-written later deadline_epoch revives
	// nothing (note says it was ignored).
	dl, note, derr := lease.Effective(d)
	if derr != nil && !errors.Is(derr, lease.ErrNoDeadline) {
		// No readable lease: treated as expired.
		note = "no readable deadline (" + derr.Error() + "): the lease counts as expired"
		dl, derr = 0, nil
	}
	now := o.Now()
	if derr != nil {
		dl = 0
	}
	if rec.State == statusfile.Cancelling {
		if why := staleCancel(d, rec, now); why != "" {
			// The run's grace was spent since the intent: TERM and
			// KILL come together, so the run ends within the bound
			// the lease promises (deadline + grace + a pass + ActAfter).
			return nil, &job{id: id, dl: dl, state: rec.State, grace: 0, reason: why, note: note, rebuilt: rec.Rebuilt}
		}
	}
	if derr == nil && now.Before(time.Unix(dl, 0)) {
		return nil, nil
	}
	if errors.Is(derr, lease.ErrNoDeadline) && rec.State == statusfile.Starting && rec.LeaseSeconds > 0 && !membership.WrapperAlive(rec) {
		// The wrapper died while starting the job, before it wrote the
		// deadline, which it would have set no later than created_at +
		// lease (+ ActAfter for a slow start). Nobody can renew a run that
		// is not running, so that deadline is final. (The deadline is
		// written with the first record now; a run of an older version,
		// or one whose deadline could not be written, has none.)
		created, err := time.Parse(time.RFC3339Nano, rec.CreatedAt)
		if err != nil {
			return &Action{RunID: id, Action: "skipped", State: rec.State, Reason: "the wrapper died while starting the run, and its created_at does not parse: " + err.Error()}, nil
		}
		dl = lease.DeadlineAfter(created, time.Duration(rec.LeaseSeconds*float64(time.Second))+ActAfter)
		if now.Before(time.Unix(dl, 0)) {
			return nil, nil
		}
		derr = nil
	}
	if errors.Is(derr, lease.ErrNoDeadline) {
		if rec.LeaseSeconds <= 0 || rec.State == statusfile.Starting {
			return nil, nil // no lease: nothing for the watchdog to enforce
		}
		// A lease, but neither the journal nor deadline_epoch says
		// when it ends: no readable lease counts as expired.
		note = "the run has a lease but no readable deadline (journal or deadline_epoch): the lease counts as expired"
		dl, derr = 0, nil
	}
	alive := membership.WrapperAlive(rec)
	if alive && (rec.State == statusfile.Cancelling || now.Before(time.Unix(dl, 0).Add(ActAfter))) {
		return nil, nil // the wrapper is on it
	}
	reason := "lease expired and the wrapper is gone"
	if alive {
		reason = "lease expired and the wrapper has not acted within " + ActAfter.String()
	}
	return nil, &job{id: id, dl: dl, state: rec.State, grace: grace, reason: reason, note: note, rebuilt: rec.Rebuilt}
}

// staleCancel says why a `cancelling` run is taken over ("" if it is not):
// its record has said so for longer than the run's grace + ActAfter, time
// enough for any stop that is at work to have written its final record,
// so whoever recorded the intent (the wrapper, cancel, another watchdog) is
// stuck or gone, whatever state its process is in.
func staleCancel(d *rundir.Dir, rec *statusfile.Record, now time.Time) string {
	since, err := d.ModTime(rundir.StatusFile)
	if err != nil {
		return ""
	}
	grace := time.Duration(rec.GraceSeconds * float64(time.Second))
	if now.Sub(since) <= grace+ActAfter {
		return ""
	}
	who := "its wrapper is gone"
	if membership.WrapperAlive(rec) {
		who = "its wrapper (pid " + fmt.Sprint(rec.WrapperPID) + ") is alive but has not finished"
		if st, err := proc.ReadStat(rec.WrapperPID); err == nil {
			switch st.State {
			case 'T', 't':
				who = "its wrapper (pid " + fmt.Sprint(rec.WrapperPID) + ") is stopped"
			case 'D':
				who = "its wrapper (pid " + fmt.Sprint(rec.WrapperPID) + ") is stuck in the kernel"
			}
		}
	}
	return fmt.Sprintf("cancelling for %v with no final record, past its grace (%v) + %v: %s", now.Sub(since).Truncate(time.Second), grace, ActAfter, who)
}

// beingCreated reports whether the run directory id is younger than
// creating, so that a missing record is one not written yet.
func beingCreated(root *rundir.Root, id string) bool {
	age, err := root.Age(id)
	return err == nil && age < creating
}

// stop performs the job: the ordered stop, without the run's lock if its
// holder is stuck.
func (j *job) stop(root *rundir.Root, o Options) *Action {
	d, err := root.Open(j.id)
	if err != nil {
		return &Action{RunID: j.id, Action: "skipped", Reason: err.Error()}
	}
	defer d.Close()
	rep, err := stop.Outside(d, stop.Options{
		Grace:    j.grace,
		Cause:    statusfile.CauseLease,
		Intent:   "deadline_expired",
		By:       "watchdog",
		Fields:   journal.Fields{"deadline_epoch": j.dl},
		Diag:     o.Diag,
		LockWait: StopLockWait,
		Bypass:   true,

		IntentUnrecorded: o.unrecorded.has(j.id),
	})
	if rep != nil && rep.IntentUnrecorded && err != nil {
		o.unrecorded.set(j.id, true)
	} else if err == nil {
		o.unrecorded.set(j.id, false)
	}
	if err != nil && (rep == nil || rep.Record == nil) {
		return &Action{RunID: j.id, Action: "refused", Deadline: j.dl, State: j.state, Reason: err.Error(), Note: j.note}
	}
	if rep.Already {
		return nil
	}
	reason := j.reason
	if j.rebuilt {
		reason += "; its record was unreadable and was rebuilt from the journal and pid files"
	}
	if rep.IntentUnrecorded {
		reason += "; the intent could not be journaled (intent_unrecorded), the stop went ahead"
	}
	if err != nil {
		reason += "; " + err.Error()
	}
	a := &Action{RunID: j.id, Action: "stopped", Reason: reason, Deadline: j.dl, State: rep.Record.State, Cause: rep.Record.Cause,
		ExitCode: rep.Record.ExitCode, Signalled: rep.Signalled, Survivors: rep.Record.Survivors, Rejected: rep.Rejected, Note: j.note}
	if rep.WithoutLock != nil {
		a.WithoutLock = []string{}
		for _, h := range rep.WithoutLock {
			a.WithoutLock = append(a.WithoutLock, h.String())
		}
		if len(a.WithoutLock) == 0 {
			a.WithoutLock = []string{"a holder that could not be seen"}
		}
	}
	return a
}
