package wrapper

import (
	"errors"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
)

// How long to keep KILLing what is left before giving up and recording
// survivors. KILL cannot be caught; only a process stuck in the kernel
// (state D on a dead NFS mount, say) outlives it.
const killWait = 10 * time.Second

// stopAll stops the group and every escaped descendant: TERM, wait for them
// to die until the grace passes, then KILL until nothing is left. It returns
// the PIDs that outlived KILL. cause "" means the leader exited on its own
// and these are stragglers.
func (s *supervisor) stopAll(cause string) []int {
	targets := s.liveTargets()
	var stopped []int
	if len(targets) > 0 {
		stopped = pids(targets)
		s.signalAll(unix.SIGTERM, targets)
		targets = s.waitGone(time.Now().Add(s.cfg.Grace), targets)
	}
	until := time.Now().Add(killWait)
	for len(targets) > 0 && time.Now().Before(until) {
		s.signalAll(unix.SIGKILL, targets)
		// KILL is not negotiable: wait a short while, then KILL again
		// whatever appeared (a job forking while it is being stopped).
		targets = s.waitGone(time.Now().Add(500*time.Millisecond), targets)
	}
	survivors := pids(targets)
	if cause == "" && len(stopped) > 0 {
		s.journal("stragglers_stopped", journal.Fields{"pids": stopped, "survivors": survivors}, false)
	}
	if len(survivors) > 0 {
		s.warn("%d processes outlived KILL: %v", len(survivors), survivors)
	}
	return survivors
}

func pids(ts []target) []int {
	out := make([]int, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.PID)
	}
	sort.Ints(out)
	return out
}

// signalAll journals the signal, then sends it to the group with killpg
// (safe: the leader is our unreaped child, so its PGID cannot have been
// recycled) and to each escaped descendant through a validated pidfd.
func (s *supervisor) signalAll(sig unix.Signal, ts []target) {
	var group, esc []int
	for _, t := range ts {
		if t.Escaped {
			esc = append(esc, t.PID)
		} else {
			group = append(group, t.PID)
		}
	}
	f := journal.Fields{"signal": proc.SignalName(sig), "pgid": s.leader, "pids": group}
	target := "group"
	if len(esc) > 0 {
		f["escaped"] = esc
		target = "group+escaped"
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
		if err := cgroup.Kill(s.cgroup); err != nil {
			s.warn("cgroup.kill %s: %v (signalling each process instead)", s.cgroup, err)
		}
	}
	if len(group) > 0 {
		if err := unix.Kill(-s.leader, sig); err != nil && err != unix.ESRCH {
			s.warn("kill(-%d, %s): %v", s.leader, proc.SignalName(sig), err)
		}
	}
	for _, t := range ts {
		if !t.Escaped {
			continue
		}
		err := proc.Signal(t.Identity, sig)
		if err != nil && !errors.Is(err, proc.ErrGone) {
			s.warn("signal %s to escaped %d: %v", proc.SignalName(sig), t.PID, err)
		}
	}
}

// waitGone waits until no target is alive or until the deadline, woken by
// SIGCHLD (as subreaper we hear of every death in the tree, at the latest
// when the zombie is reparented to us) with a backstop rescan. Signals to the
// wrapper while it is stopping change nothing: the stop is already under way.
func (s *supervisor) waitGone(until time.Time, ts []target) []target {
	backoff := 5 * time.Millisecond
	for {
		if !s.leaderExited {
			s.pollLeader()
		}
		if len(ts) == 0 {
			return nil
		}
		left := time.Until(until)
		if left <= 0 {
			return ts
		}
		wait := backoff
		if wait > left {
			wait = left
		}
		t := time.NewTimer(wait)
		select {
		case <-s.sigs:
		case <-t.C:
			if backoff < 100*time.Millisecond {
				backoff *= 2
			}
		}
		t.Stop()
		ts = s.recheck(ts)
		if len(ts) == 0 {
			ts = s.scanFast()
		}
	}
}
