// Package stop finds and stops what is left of a run from outside its
// wrapper: the one validation step that cancel and the watchdog (and, read
// only, reconcile) share, and the ordered stop they perform when the wrapper
// is gone.
//
// Validation, before any signal: the run directory is the caller's (rundir
// checks that when it opens it); the record's boot_id is this boot's; a
// group member must have the recorded PGID and SID and must not have started
// before the leader; an escaped descendant must have its recorded start
// time. A member is signalled through a pidfd after that check (see
// proc.Signal), so a recycled PID never receives a signal.
package stop

import (
	"errors"
	"fmt"
	"sort"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// ErrBootChanged is returned (wrapped) by Check when the record is from an
// earlier boot: none of its PIDs mean anything now.
var ErrBootChanged = errors.New("host rebooted since the run started")

// ErrNoGroup is returned (wrapped) by Check when the record names no
// process group (the run never got past starting).
var ErrNoGroup = errors.New("the record names no process group")

// Check validates the record itself: this boot, a plausible PGID/SID.
func Check(rec *statusfile.Record) error {
	boot, err := proc.BootID()
	if err != nil {
		return fmt.Errorf("cannot read this boot's ID: %w", err)
	}
	if rec.BootID != boot {
		return fmt.Errorf("%w (recorded boot_id %s, now %s)", ErrBootChanged, rec.BootID, boot)
	}
	if rec.PGID <= 1 || rec.SID <= 1 {
		return ErrNoGroup
	}
	if rec.PGID != rec.PID || rec.SID != rec.PID {
		return fmt.Errorf("record is inconsistent: pid %d, pgid %d, sid %d (they must be equal)", rec.PID, rec.PGID, rec.SID)
	}
	return nil
}

// Target is a live process a stop must end.
type Target struct {
	proc.Stat
	Escaped bool
}

// Identity is what a signal to t must match.
func (t Target) Identity(rec *statusfile.Record) proc.Identity {
	if t.Escaped {
		return proc.Identity{PID: t.PID, Start: t.Start}
	}
	return proc.Identity{PID: t.PID, Start: t.Start, PGID: rec.PGID, SID: rec.SID, MinStart: rec.LeaderStart}
}

// Live returns the run's validated live processes, read from /proc: group
// members (recorded PGID and SID, started no earlier than the leader, not a
// zombie) and recorded escaped descendants that still have their recorded
// start time. If the process at the leader's PID has another start time, the
// group number was recycled and no group member is a target. A run with a
// cgroup is judged by it: every live process in the cgroup is a target, and
// a process of the group outside it is not. Without a cgroup one case stays
// undecidable: the whole group died, its number was reused by a new session
// whose leader has also exited; its members then pass every check. That
// needs a PID reuse and a second session leader's exit between two looks,
// and is the reason a cgroup boundary is preferred where the host has one. Processes that
// fail validation are returned in rejected with
// the reason, never as targets. The caller must have called Check.
func Live(rec *statusfile.Record) (targets []Target, rejected []string, err error) {
	all, err := proc.Scan()
	if err != nil {
		return nil, nil, err
	}
	esc := map[int]statusfile.Escaped{}
	for _, e := range rec.Escaped {
		esc[e.PID] = e
	}
	// A process at the leader's PID with another start time means the PID,
	// and with it the group and session numbers, now belong to someone else:
	// nothing in that group is ours.
	groupReused := false
	for _, p := range all {
		if p.PID == rec.PID && p.Start != rec.LeaderStart {
			groupReused = true
			rejected = append(rejected, fmt.Sprintf("pid %d started at tick %d, not the recorded leader_start %d: PID reused; its process group %d is not this run's, left alone", p.PID, p.Start, rec.LeaderStart, rec.PGID))
		}
	}
	// With a cgroup, membership is a live fact, stronger than the group
	// number: a group member must be in the run's cgroup, and a cgroup that
	// is gone (it can only be removed empty) means the group is gone.
	inCgroup := map[int]bool{}
	haveCgroup := rec.Cgroup != "" && cgroup.Valid(rec.Cgroup)
	if haveCgroup {
		pids, _ := cgroup.Procs(rec.Cgroup)
		for _, p := range pids {
			inCgroup[p] = true
		}
	}
	for _, p := range all {
		if p.Dead() {
			continue
		}
		if inCgroup[p.PID] {
			// In the run's own cgroup: nothing else is ever put there, and
			// membership is a live fact, not a recorded claim.
			targets = append(targets, Target{Stat: p, Escaped: p.PGID != rec.PGID || groupReused})
			continue
		}
		if e, ok := esc[p.PID]; ok {
			if p.Start == e.Start {
				targets = append(targets, Target{Stat: p, Escaped: true})
			} else {
				rejected = append(rejected, fmt.Sprintf("pid %d was recorded as escaped but started at tick %d, not %d: PID reused, left alone", p.PID, p.Start, e.Start))
			}
			continue
		}
		if p.PGID != rec.PGID || groupReused {
			continue
		}
		if haveCgroup {
			rejected = append(rejected, fmt.Sprintf("pid %d has the run's process group %d but is not in the run's cgroup %s: the group number was recycled, left alone", p.PID, rec.PGID, rec.Cgroup))
			continue
		}
		id := proc.Identity{PID: p.PID, PGID: rec.PGID, SID: rec.SID, MinStart: rec.LeaderStart}
		if p.PID == rec.PID {
			id.Start = rec.LeaderStart
		}
		if err := id.Check(p); err != nil {
			rejected = append(rejected, err.Error()+": left alone")
			continue
		}
		targets = append(targets, Target{Stat: p})
	}
	sort.Slice(targets, func(i, j int) bool { return targets[i].PID < targets[j].PID })
	return targets, rejected, nil
}

// PIDs lists the targets' PIDs.
func PIDs(ts []Target) []int {
	out := make([]int, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.PID)
	}
	return out
}

// WrapperAlive reports whether the record's wrapper is still the live
// process it recorded: same boot, same PID, same start time, not a zombie.
func WrapperAlive(rec *statusfile.Record) bool {
	if rec.WrapperPID <= 1 {
		return false
	}
	if boot, err := proc.BootID(); err != nil || boot != rec.BootID {
		return false
	}
	st, err := proc.ReadStat(rec.WrapperPID)
	if err != nil || st.Dead() {
		return false
	}
	return rec.WrapperStart == 0 || st.Start == rec.WrapperStart
}
