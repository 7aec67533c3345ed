package wrapper

import (
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// target is a process the stop must end: a member of the job's group, or a
// descendant that escaped it.
type target struct {
	proc.Stat
	escaped bool
}

// scan reads the process table once: it reaps zombie children other than
// the leader, records new escapes (when record is set) and returns the live
// targets.
func (s *supervisor) scan(record bool) []target {
	all, err := proc.Scan()
	if err != nil {
		s.warn("cannot read /proc: %v", err)
		return nil
	}
	children := map[int][]int{}
	byPID := make(map[int]proc.Stat, len(all))
	for _, p := range all {
		byPID[p.PID] = p
		children[p.PPID] = append(children[p.PPID], p.PID)
	}
	// Descendants: as subreaper, every orphan of the job is reparented to
	// us, so the tree below us is the job's whole tree.
	desc := map[int]bool{}
	queue := []int{s.self}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !desc[c] {
				desc[c] = true
				queue = append(queue, c)
			}
		}
	}
	inCgroup := map[int]bool{}
	if s.cgroup != "" {
		pids, _ := cgroup.Procs(s.cgroup)
		for _, p := range pids {
			inCgroup[p] = true
		}
	}
	var out []target
	for _, p := range all {
		if p.PPID == s.self && p.Dead() && p.PID != s.leader {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p.PID, &ws, unix.WNOHANG, nil)
			continue
		}
		if p.Dead() || p.PID == s.self {
			continue
		}
		inGroup := p.PGID == s.leader && p.SID == s.leader && p.Start >= s.leaderStart
		if inGroup {
			out = append(out, target{Stat: p})
			continue
		}
		if desc[p.PID] {
			if record {
				s.noteEscape(p)
			}
			out = append(out, target{Stat: p, escaped: true})
			continue
		}
		// Escaped earlier and since reparented away from us (cannot happen
		// while we are its subreaper, but the record is the authority), or
		// in the run's cgroup, which nothing leaves by forking.
		if e, ok := s.escaped[p.PID]; ok && e.Start == p.Start {
			out = append(out, target{Stat: p, escaped: true})
		} else if inCgroup[p.PID] {
			out = append(out, target{Stat: p, escaped: true})
		}
	}
	return out
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
	s.writeRecord(false) // the synced journal line is the durable fact
}

func (s *supervisor) liveTargets() []target { return s.scanFast() }

// scanFast lists the targets from the run's cgroup when it has one: one
// read of cgroup.procs and one stat per member, instead of every process on
// the host. Escapes recorded earlier are checked by PID. Without a cgroup it
// is scan.
func (s *supervisor) scanFast() []target {
	if s.cgroup == "" {
		return s.scan(true)
	}
	pids, err := cgroup.Procs(s.cgroup)
	if err != nil {
		return s.scan(true)
	}
	seen := map[int]bool{}
	var out []target
	for _, pid := range pids {
		if pid == s.self {
			continue
		}
		p, err := proc.ReadStat(pid)
		if err != nil || p.Dead() {
			continue
		}
		seen[pid] = true
		if p.PGID == s.leader && p.SID == s.leader && p.Start >= s.leaderStart {
			out = append(out, target{Stat: p})
			continue
		}
		s.noteEscape(p)
		out = append(out, target{Stat: p, escaped: true})
	}
	for pid, e := range s.escaped {
		if seen[pid] {
			continue
		}
		if p, err := proc.ReadStat(pid); err == nil && !p.Dead() && p.Start == e.Start {
			out = append(out, target{Stat: p, escaped: true})
		}
	}
	return out
}

// recheck keeps the targets that are still alive, reading only their own
// /proc/PID/stat.
func (s *supervisor) recheck(ts []target) []target {
	var out []target
	for _, t := range ts {
		st, err := proc.ReadStat(t.PID)
		if err != nil || st.Start != t.Start || st.Dead() {
			continue
		}
		out = append(out, t)
	}
	return out
}
