package stop

import (
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// KillWait bounds how long KILL is repeated before the survivors are
// recorded. KILL cannot be caught; only a process stuck in the kernel
// outlives it.
const KillWait = 10 * time.Second

// Options describe a stop performed from outside the wrapper.
type Options struct {
	Grace  time.Duration // between TERM and KILL
	Cause  string        // statusfile.CauseCancel or CauseLease, unless one is recorded already
	Intent string        // journal event for the intent: cancel_requested or deadline_expired
	By     string        // "cancel" or "watchdog", journaled
	Fields journal.Fields
	Diag   io.Writer
}

// Report is what an outside stop did.
type Report struct {
	Record    *statusfile.Record // the final record (or the terminal one found)
	Signalled []int              // PIDs sent TERM or KILL
	Rejected  []string           // processes left alone, and why
	Already   bool               // the run was terminal before we acted
}

// ErrRefused is returned (wrapped) when validation fails and nothing was
// signalled.
var ErrRefused = errors.New("refusing to signal")

// Outside performs the ordered stop of a run whose wrapper is gone (or has
// not acted): under the run's lock the intent is journaled and synced and
// `cancelling` written, unless a cancel is already recorded (whose cause
// then stands); then TERM to every validated live process, wait until they
// are gone or the grace passes, KILL what is left, and under the lock again
// the final `cancelled` record with the survivors. A record already terminal
// is returned as it is; nothing is signalled then.
func Outside(d *rundir.Dir, o Options) (*Report, error) {
	if o.Diag == nil {
		o.Diag = io.Discard
	}
	rep := &Report{}
	unlock, err := d.Lock()
	if err != nil {
		return nil, err
	}
	rec, err := statusfile.Read(d)
	if err != nil {
		unlock()
		return nil, err
	}
	if statusfile.Terminal(rec.State) {
		unlock()
		rep.Record, rep.Already = rec, true
		return rep, nil
	}
	err = membership.Check(rec)
	if errors.Is(err, membership.ErrNoGroup) && adoptStarting(d, rec) {
		err = membership.Check(rec)
	}
	if errors.Is(err, membership.ErrNoGroup) && rec.State == statusfile.Starting && d.Exists(rundir.StdoutFile) {
		// The wrapper got as far as opening the job's logs, so the job may
		// have been started, but nothing says which process it is: a
		// `cancelled` record now could be a lie. Leave it unknown.
		err = errors.New("its wrapper died while starting the job, after opening its logs and before recording its PID: whether the job runs cannot be told, so the run is not recorded as stopped")
	}
	if err != nil && !errors.Is(err, membership.ErrNoGroup) {
		journal.Append(d, "stop_refused", journal.Fields{"by": o.By, "reason": err.Error()}, true)
		unlock()
		return nil, fmt.Errorf("run %s: %w: %v", d.ID, ErrRefused, err)
	}
	if rec.State != statusfile.Cancelling || rec.Cause == "" {
		f := journal.Fields{"cause": o.Cause, "by": o.By}
		for k, v := range o.Fields {
			f[k] = v
		}
		if _, err := journal.Append(d, o.Intent, f, true); err != nil {
			// The intent must be on disk before any signal.
			unlock()
			return nil, fmt.Errorf("run %s: cannot journal the intent, so nothing was signalled: %w", d.ID, err)
		}
		rec.State, rec.Cause = statusfile.Cancelling, o.Cause
		if err := statusfile.Write(d, rec, false); err != nil {
			fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot write status.json: %v (stopping anyway: the intent is journaled)\n", d.ID, err)
		}
	}
	cause := rec.Cause
	unlock()

	type sent struct {
		pid int
		sig unix.Signal
	}
	signalled := map[sent]bool{}
	if rec.PGID > 1 {
		send := func(sig unix.Signal, deadline time.Time) []membership.Member {
			for {
				ts, rejected, err := membership.Run{Record: rec}.Members()
				if err != nil {
					fmt.Fprintf(o.Diag, "agent-wrap: run %s: cannot read /proc: %v\n", d.ID, err)
					return nil
				}
				rep.Rejected = appendNew(rep.Rejected, rejected)
				if len(ts) == 0 {
					return nil
				}
				var fresh []membership.Member
				for _, t := range ts {
					if !signalled[sent{t.PID, sig}] {
						fresh = append(fresh, t)
					}
				}
				if sig == unix.SIGKILL && rec.Cgroup != "" && cgroup.Valid(rec.Cgroup) {
					journal.Append(d, "signal_sent", journal.Fields{"signal": "KILL", "target": "cgroup", "cgroup": rec.Cgroup, "pids": pids(ts), "by": o.By}, false)
					if err := cgroup.Kill(rec.Cgroup); err != nil {
						fmt.Fprintf(o.Diag, "agent-wrap: run %s: cgroup.kill: %v (signalling each process instead)\n", d.ID, err)
					}
				}
				if len(fresh) > 0 {
					journal.Append(d, "signal_sent", journal.Fields{"signal": proc.SignalName(sig), "target": "validated", "pgid": rec.PGID, "pids": pids(fresh), "by": o.By}, false)
					for _, t := range fresh {
						signalled[sent{t.PID, sig}] = true
						if err := proc.Signal(t.Identity, sig); err != nil && !errors.Is(err, proc.ErrGone) {
							rep.Rejected = appendNew(rep.Rejected, []string{err.Error() + ": left alone"})
						}
					}
				}
				if time.Now().After(deadline) {
					return ts
				}
				time.Sleep(backoff(deadline))
			}
		}
		left := send(unix.SIGTERM, time.Now().Add(o.Grace))
		if len(left) > 0 {
			left = send(unix.SIGKILL, time.Now().Add(KillWait))
		}
		for k := range signalled {
			rep.Signalled = appendInt(rep.Signalled, k.pid)
		}
		if len(rep.Rejected) > 0 {
			journal.Append(d, "signal_refused", journal.Fields{"by": o.By, "reasons": rep.Rejected}, false)
		}
		rep.Record = rec
		survivors := pids(left)
		if rec.Cgroup != "" && len(survivors) == 0 && cgroup.Valid(rec.Cgroup) {
			cgroup.Remove(rec.Cgroup)
		}
		return finalize(d, rep, cause, survivors, o)
	}
	rep.Record = rec
	return finalize(d, rep, cause, nil, o)
}

// backoff is the poll interval while waiting for processes we are not the
// parent of: no SIGCHLD reaches us, so /proc is read again, 10 ms at first.
func backoff(deadline time.Time) time.Duration {
	d := time.Until(deadline)
	if d > 20*time.Millisecond {
		return 20 * time.Millisecond
	}
	if d < time.Millisecond {
		return time.Millisecond
	}
	return d
}

func finalize(d *rundir.Dir, rep *Report, cause string, survivors []int, o Options) (*Report, error) {
	if survivors == nil {
		survivors = []int{}
	}
	unlock, err := d.Lock()
	if err != nil {
		return rep, err
	}
	defer unlock()
	rec, err := statusfile.Read(d)
	if err != nil {
		return rep, err
	}
	if statusfile.Terminal(rec.State) {
		rep.Record = rec
		return rep, nil
	}
	rec.State, rec.Cause = statusfile.Cancelled, cause
	rec.SetExit(statusfile.CauseExitCode(cause))
	rec.Survivors = survivors
	rec.EndedAt = statusfile.Timestamp(time.Now())
	if err := statusfile.Write(d, rec, true); err != nil {
		return rep, fmt.Errorf("run %s: stopped, but cannot write the final record: %w", d.ID, err)
	}
	journal.Append(d, "final", journal.Fields{"state": rec.State, "cause": cause, "exit_code": rec.Code(), "survivors": survivors, "by": o.By}, true)
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

func appendInt(dst []int, v int) []int {
	for _, x := range dst {
		if x == v {
			return dst
		}
	}
	return append(dst, v)
}

// pids lists the members' PIDs.
func pids(ms []membership.Member) []int {
	out := make([]int, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.PID)
	}
	return out
}
