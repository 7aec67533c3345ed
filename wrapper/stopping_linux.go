package wrapper

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

// stopAll stops the group and every escaped descendant with the one stop
// loop (stop.Loop: TERM, the grace, then freeze and KILL until two looks
// find nothing), woken by SIGCHLD. With the run's cgroup, cgroup.kill ends
// the stop once the grace is over, and the loop's proof is the cgroup
// unpopulated; either way, no live child of the wrapper may be left. cause
// "" means the leader exited on its own and these are stragglers.
func (s *supervisor) stopAll(cause string) stop.Result {
	// The runs the job handed on to other hosts end first, each through
	// its own controller, so that nothing of the run outlives it there.
	s.endHandoffs()
	loop := stop.Loop{Members: s.liveTargets, Signal: s.signalAll, Wake: s.wake, Empty: s.empty}
	if s.cgroup != "" {
		loop.Sweep = func() { s.signalAll(unix.SIGKILL, nil, true) }
	}
	res := loop.Run(s.cfg.Grace)
	s.pollLeader()
	if cause == "" && len(res.Stopped) > 0 {
		s.journal("stragglers_stopped", journal.Fields{"pids": res.Stopped, "survivors": res.Survivors}, false)
	}
	if len(res.Survivors) > 0 {
		s.warn("%d processes outlived KILL: %v", len(res.Survivors), res.Survivors)
	}
	return res
}

// empty is the stop loop's proof beyond its looks: the run's cgroup (if it
// has one) holds no live process, and the wrapper has no live child but the
// leader (a member, which the looks see while it lives). Zombie children
// other than the leader are reaped on the way.
func (s *supervisor) empty() bool {
	if s.cgroup != "" {
		if p, err := cgroup.Populated(s.cgroup); err != nil || p {
			return false
		}
	}
	cs, ok := proc.Children(s.self)
	if !ok {
		return true // no children files: settle's wait4 is the proof
	}
	for _, c := range cs {
		if c == s.reap.leader {
			continue
		}
		st, err := proc.ReadStat(c)
		if err != nil {
			continue
		}
		if !st.Dead() {
			return false
		}
		s.reap.reapZombie(c)
	}
	return true
}

// settleWait bounds settle's freezing and killing, as killWait bounds the
// stop loop's.
const settleWait = 10 * time.Second

// settle ends every run, after the stop (or after the leader's exit when
// nothing was left to stop): it reaps the leader and every other child,
// then freezes and KILLs whatever still descends from the wrapper, until
// wait4 says that no child is left (ECHILD). The wrapper is the subreaper
// of every process the job made, so every live one is its descendant, and
// a child reparented to it while a look passed is still its child: no
// child at all is the proof that nothing is left. With the run's cgroup,
// the cgroup must be unpopulated as well. It returns the proof, or the
// PIDs still alive when settleWait passed. Only processes that descend from
// the wrapper are signalled, each through a checked pidfd: the leader is
// reaped by then, so the group number proves nothing any more.
func (s *supervisor) settle() (left []int, proven bool) {
	s.pollLeader()
	s.reap.reapAll()
	until := time.Now().Add(settleWait)
	killed := map[proc.Identity]bool{}
	for {
		none := s.reap.none()
		populated := false
		if s.cgroup != "" {
			p, err := cgroup.Populated(s.cgroup)
			populated = err != nil || p
		}
		if none && !populated {
			return nil, true
		}
		ds, err := proc.Descendants(s.self)
		if err != nil {
			s.warn("cannot read /proc: %v", err)
		}
		var live, fresh []int
		var ids []proc.Identity
		for _, d := range ds {
			if d.Dead() {
				continue
			}
			live = append(live, d.PID)
			id := proc.Identity{PID: d.PID, Start: d.Start}
			if !killed[id] {
				killed[id] = true
				fresh = append(fresh, d.PID)
				ids = append(ids, id)
			}
		}
		if !time.Now().Before(until) {
			return live, false
		}
		if len(fresh) > 0 || populated {
			s.signalDescendants(ids, fresh, populated)
		}
		s.wake(nil, 20*time.Millisecond)
	}
}

// signalDescendants journals and sends STOP, then KILL, to each of ids
// (their PIDs are pids), and cgroup.kill to the run's cgroup when withCgroup.
func (s *supervisor) signalDescendants(ids []proc.Identity, pids []int, withCgroup bool) {
	for _, sig := range []unix.Signal{unix.SIGSTOP, unix.SIGKILL} {
		f := journal.Fields{"signal": proc.SignalName(sig), "target": "descendants", "pids": pids}
		if withCgroup && sig == unix.SIGKILL {
			f["target"], f["cgroup"] = "descendants+cgroup", s.cgroup
		}
		s.journal("signal_sent", f, false)
		for _, id := range ids {
			if err := stop.Signal(id, sig); err != nil && !errors.Is(err, proc.ErrGone) {
				s.warn("signal %s to descendant %d: %v", proc.SignalName(sig), id.PID, err)
			}
		}
		if withCgroup && sig == unix.SIGKILL {
			if err := stop.KillCgroup(s.cgroup); err != nil {
				s.warn("cgroup.kill %s: %v", s.cgroup, err)
			}
		}
	}
}

// signalAll journals the signal, then sends it to the group with killpg
// (safe: the leader is our unreaped child, so its PGID cannot have been
// recycled) and to each escaped descendant through a validated pidfd. A
// TERM sent again (to late arrivals) goes to each of them through a pidfd
// too, so the group does not get a second TERM.
func (s *supervisor) signalAll(sig unix.Signal, ts []target, again bool) {
	perProcess := again && sig != unix.SIGKILL
	var group, esc []int
	for _, t := range ts {
		if t.Escaped {
			esc = append(esc, t.PID)
		} else {
			group = append(group, t.PID)
		}
	}
	f := journal.Fields{"signal": proc.SignalName(sig), "pgid": s.reap.leader, "pids": group}
	target := "group"
	if perProcess {
		target = "members"
	}
	if len(esc) > 0 {
		f["escaped"] = esc
		target += "+escaped"
		if len(group) == 0 {
			target = "escaped"
		}
	}
	useCgroupKill := sig == unix.SIGKILL && s.cgroup != ""
	if useCgroupKill && len(ts) == 0 {
		target = "cgroup" // the sweep at the end of the grace
	} else if useCgroupKill {
		target += "+cgroup"
		f["cgroup"] = s.cgroup
	}
	f["target"] = target
	s.journal("signal_sent", f, false)
	if useCgroupKill {
		if err := stop.KillCgroup(s.cgroup); err != nil {
			s.warn("cgroup.kill %s: %v (signalling each process instead)", s.cgroup, err)
		}
	}
	if len(group) > 0 && !perProcess {
		if err := unix.Kill(-s.reap.leader, sig); err != nil && err != unix.ESRCH {
			s.warn("kill(-%d, %s): %v", s.reap.leader, proc.SignalName(sig), err)
		}
	}
	for _, t := range ts {
		if !t.Escaped && !perProcess {
			continue
		}
		err := stop.Signal(t.Identity, sig)
		if err != nil && !errors.Is(err, proc.ErrGone) {
			what := "member"
			if t.Escaped {
				what = "escaped"
			}
			s.warn("signal %s to %s %d: %v", proc.SignalName(sig), what, t.PID, err)
		}
	}
}

// wake is the stop loop's wake-up: SIGCHLD (as subreaper we hear of every
// death in the tree, at the latest when the zombie is reparented to us), or
// the time. Signals to the wrapper while it is stopping change nothing: the
// stop is already under way. It notes the leader's exit as it goes.
func (s *supervisor) wake(_ []target, d time.Duration) bool {
	s.pollLeader()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.sigs:
		return true
	case <-t.C:
		return false
	}
}
