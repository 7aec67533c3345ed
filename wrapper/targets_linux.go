package wrapper

import (
	"slices"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// A target is a process the stop must end: a member of the job's group, or
// a descendant that escaped it. Which processes those are is membership's
// answer, asked as the run's own wrapper (membership.Run.Supervisor).
type target = membership.Member

// members is the run as membership judges it from this wrapper: the live
// record, with the wrapper's own PID. Only the supervisor's goroutine may
// use it (it reads s.rec); other goroutines use contains.
func (s *supervisor) members() membership.Run {
	return membership.Run{Record: &s.rec, Supervisor: s.self}
}

// contains reports whether pid, seen with start time start, is a live
// process of this run (see membership.Run.Contains). Safe from any
// goroutine: it judges a copy of the record taken when the job started and
// at each recorded escape.
func (s *supervisor) contains(pid int, start uint64) (membership.Member, error) {
	rec := s.view.Load()
	if rec == nil {
		return membership.Member{}, membership.ErrNotMember
	}
	return membership.Run{Record: rec, Supervisor: s.self}.Contains(pid, start)
}

// publish makes the current record the one contains judges by.
func (s *supervisor) publish() {
	r := s.rec
	r.Escaped = slices.Clone(s.rec.Escaped)
	r.Command = nil
	s.view.Store(&r)
}

// scan looks at the processes below the wrapper once (proc.Descendants:
// as their subreaper, every process the job made is one of them, so the
// rest of the host need not be read): it reaps zombie children other than
// the leader, records new escapes and returns the live targets.
func (s *supervisor) scan() []target {
	all, err := proc.Descendants(s.self)
	if err != nil {
		s.warn("cannot read /proc: %v", err)
		return nil
	}
	for _, p := range all {
		if p.PPID == s.self && p.Dead() {
			s.reap.reapZombie(p.PID) // never the leader
		}
	}
	out, _ := s.members().Judge(all)
	s.noteEscapes(out)
	return out
}

// noteEscapes records each escaped target not recorded yet.
func (s *supervisor) noteEscapes(ts []target) {
	for _, t := range ts {
		if t.Escaped {
			s.noteEscape(t.Stat)
		}
	}
}

// noteEscape journals and records a descendant outside the job's group.
func (s *supervisor) noteEscape(p proc.Stat) {
	if e, ok := s.escaped[p.PID]; ok && e.Start == p.Start {
		return
	}
	argv, _ := proc.Cmdline(p.PID)
	e := statusfile.Escaped{PID: p.PID, PGID: p.PGID, SID: p.SID, Start: p.Start, Argv: argv}
	s.escaped[p.PID] = e
	s.journal("escaped", journal.Fields{"pid": p.PID, "pgid": p.PGID, "sid": p.SID, "start": p.Start, "argv": argv}, true)
	s.rec.Escaped = append(s.rec.Escaped, e)
	s.publish()
	s.writeRecord(false) // the synced journal line is the durable fact
}

func (s *supervisor) liveTargets() []target { return s.scanFast() }

// look is the wait's backstop, every second or two while the job runs
// (nextLook): it records escapes, and reaps the job's orphans should a
// SIGCHLD have been coalesced with another. With a cgroup it reads the
// run's cgroup; without, the run's tracker (membership.Tracker) reads only
// what could have changed since its last look, not every process on the
// host. quiet: the tracker found that nothing of the run had run since its
// last look (never with a cgroup, whose look is always the same read).
func (s *supervisor) look() (quiet bool) {
	s.reap.reapOthers()
	if s.cgroup != "" {
		if out, ok := s.members().CgroupMembers(); ok {
			s.noteEscapes(out)
			return false
		}
	}
	if s.tracker == nil {
		s.tracker = membership.NewTracker(s.members())
	}
	before := s.tracker.Counts().Quiet
	out, err := s.tracker.Look()
	if err != nil {
		s.warn("cannot read /proc: %v", err)
	}
	s.noteEscapes(out)
	return err == nil && s.tracker.Counts().Quiet > before
}

// scanFast lists the targets from the run's cgroup when it has one: one
// read of cgroup.procs and one stat per member, instead of every process on
// the host. Escapes recorded earlier are checked by PID. Without a cgroup it
// is scan.
func (s *supervisor) scanFast() []target {
	if s.cgroup == "" {
		return s.scan()
	}
	out, ok := s.members().CgroupMembers()
	if !ok {
		return s.scan()
	}
	s.noteEscapes(out)
	return out
}
