package wrapper

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

// stopAll stops the group and every escaped descendant with the one stop
// loop (stop.Loop: TERM, the grace, KILL until nothing is left), woken by
// SIGCHLD. It returns the PIDs that outlived KILL. cause "" means the
// leader exited on its own and these are stragglers.
func (s *supervisor) stopAll(cause string) []int {
	// The runs the job handed on to other hosts end first, each through
	// its own controller, so that nothing of the run outlives it there.
	s.endHandoffs()
	loop := stop.Loop{Members: s.liveTargets, Signal: s.signalAll, Wake: s.wake}
	stopped, survivors := loop.Run(s.cfg.Grace)
	s.pollLeader()
	if cause == "" && len(stopped) > 0 {
		s.journal("stragglers_stopped", journal.Fields{"pids": stopped, "survivors": survivors}, false)
	}
	if len(survivors) > 0 {
		s.warn("%d processes outlived KILL: %v", len(survivors), survivors)
	}
	return survivors
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
	if useCgroupKill {
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
