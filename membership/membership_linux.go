package membership

import (
	"errors"
	"fmt"
	"sort"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// ErrNoGroup is returned (wrapped) by Check when the record names no
// process group (the run never got past starting).
var ErrNoGroup = errors.New("the record names no process group")

// ErrNotMember is returned (wrapped, with the reason) by Run.Contains and
// Find when the process is not one of the run's (or of any run's).
var ErrNotMember = errors.New("not a process of the run")

var errBootChanged = errors.New("host rebooted since the run started")

// Check validates the record itself: this boot, a plausible PGID/SID. Its
// PIDs mean nothing unless it passes (a record that fails with ErrNoGroup
// may still have a cgroup, see Run.CgroupMembers).
func Check(rec *statusfile.Record) error {
	if err := checkBoot(rec); err != nil {
		return err
	}
	if rec.PGID <= 1 || rec.SID <= 1 {
		return ErrNoGroup
	}
	if rec.PGID != rec.PID || rec.SID != rec.PID {
		return fmt.Errorf("record is inconsistent: pid %d, pgid %d, sid %d (they must be equal)", rec.PID, rec.PGID, rec.SID)
	}
	return nil
}

func checkBoot(rec *statusfile.Record) error {
	boot, err := proc.BootID()
	if err != nil {
		return fmt.Errorf("cannot read this boot's ID: %w", err)
	}
	if rec.BootID != boot {
		return fmt.Errorf("%w (recorded boot_id %s, now %s)", errBootChanged, rec.BootID, boot)
	}
	return nil
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
	return proc.Alive(rec.WrapperPID, rec.WrapperStart)
}

// Member is a live process of a run.
type Member struct {
	proc.Stat
	// Escaped: the process is the run's but not a member of its process
	// group (it left by setsid or setpgid, or the group number was
	// recycled); a group signal does not reach it.
	Escaped bool
	// Identity is what a signal to it must match (see stop.Signal): its PID
	// and start time, and for a group member the run's PGID and SID and no
	// start before the leader's.
	Identity proc.Identity
}

// Run is one run's membership as one caller sees it.
type Run struct {
	// Record is the run's record. Only read, while a method runs; the
	// caller must not change it meanwhile. PID, PGID, SID, LeaderStart,
	// BootID, Cgroup and Escaped are what count.
	Record *statusfile.Record
	// Supervisor is set only by the run's own wrapper, to its own PID. The
	// leader is then the caller's unreaped child, so the group number
	// cannot have been recycled and a group member counts wherever it is;
	// and every descendant of the caller (the subreaper of the job's tree)
	// is the run's, recorded as an escape or not yet. The record's cgroup
	// is trusted as the caller's own, not checked with cgroup.Valid.
	Supervisor int
	// Logs, for a caller outside the wrapper (LogsOf the run's directory),
	// makes a process that holds the run's logs as its fd 1 or 2 the
	// run's, where the run has no cgroup to go by: so a process that left
	// the job's session and tree unrecorded is found after its wrapper
	// died. The zero value finds nothing this way.
	Logs Logs
}

// facts are what the judgment of one process needs to know of the others.
type facts struct {
	groupReused bool
	haveCgroup  bool
	inCgroup    func(pid int) bool
	descendant  func(pid int) bool
	escaped     map[int]uint64 // the recorded escapes by PID; nil: look in the record
}

// haveCgroup reports whether the record's cgroup is one to go by.
func (r Run) haveCgroup() bool {
	c := r.Record.Cgroup
	return c != "" && (r.Supervisor != 0 || cgroup.Valid(c))
}

// inGroup reports whether p has the run's group, session and no earlier
// start than the leader.
func (r Run) inGroup(p proc.Stat, f *facts) bool {
	rec := r.Record
	return rec.PGID > 1 && !f.groupReused && p.PGID == rec.PGID && p.SID == rec.SID && p.Start >= rec.LeaderStart
}

// judge decides one live-looking process. It returns the member and ok, or
// why the process was left alone (reject non-empty), or neither: a process
// that is simply not the run's.
func (r Run) judge(p proc.Stat, f *facts) (m Member, ok bool, reject string) {
	rec := r.Record
	if p.Dead() || (r.Supervisor != 0 && p.PID == r.Supervisor) {
		return m, false, ""
	}
	grouped := r.inGroup(p, f)
	member := func(escaped bool) (Member, bool, string) {
		id := proc.Identity{PID: p.PID, Start: p.Start}
		if !escaped {
			id.PGID, id.SID, id.MinStart = rec.PGID, rec.SID, rec.LeaderStart
		}
		return Member{Stat: p, Escaped: escaped, Identity: id}, true, ""
	}
	if f.haveCgroup && f.inCgroup(p.PID) {
		// In the run's own cgroup: nothing else is ever put there, and
		// membership is a live fact, not a recorded claim.
		return member(!grouped)
	}
	if r.Supervisor != 0 && grouped {
		return member(false)
	}
	if r.Supervisor != 0 && f.descendant(p.PID) {
		return member(true)
	}
	if start, ok := f.escape(rec, p.PID); ok {
		if p.Start == start {
			return member(true)
		}
		return m, false, fmt.Sprintf("pid %d was recorded as escaped but started at tick %d, not %d: PID reused, left alone", p.PID, p.Start, start)
	}
	if rec.PGID <= 1 || p.PGID != rec.PGID || f.groupReused {
		return m, false, ""
	}
	if f.haveCgroup {
		return m, false, fmt.Sprintf("pid %d has the run's process group %d but is not in the run's cgroup %s: the group number was recycled, left alone", p.PID, rec.PGID, rec.Cgroup)
	}
	id := proc.Identity{PID: p.PID, PGID: rec.PGID, SID: rec.SID, MinStart: rec.LeaderStart}
	if p.PID == rec.PID {
		id.Start = rec.LeaderStart
	}
	if err := id.Check(p); err != nil {
		return m, false, err.Error() + ": left alone"
	}
	return member(false)
}

// escape returns the recorded start time of an escape at pid.
func (f *facts) escape(rec *statusfile.Record, pid int) (uint64, bool) {
	if f.escaped != nil {
		start, ok := f.escaped[pid]
		return start, ok
	}
	for _, e := range rec.Escaped {
		if e.PID == pid {
			return e.Start, true
		}
	}
	return 0, false
}

// reusedLeader returns the reason the group number is no longer the run's
// when leader, the process now at the recorded leader's PID, has another
// start time; "" otherwise. The run's wrapper holds its leader unreaped, so
// for it the number is never reused.
func (r Run) reusedLeader(leader proc.Stat) string {
	rec := r.Record
	if r.Supervisor != 0 || rec.PID <= 1 || leader.PID != rec.PID || leader.Start == rec.LeaderStart {
		return ""
	}
	return fmt.Sprintf("pid %d started at tick %d, not the recorded leader_start %d: PID reused; its process group %d is not this run's, left alone", leader.PID, leader.Start, rec.LeaderStart, rec.PGID)
}

// Judge returns the run's live members in a process table (one proc.Scan),
// sorted by PID, and the processes that claimed to be the run's but failed
// validation, with the reason. The caller of a run from outside its wrapper
// must have called Check.
func (r Run) Judge(all []proc.Stat) (members []Member, rejected []string) {
	f := &facts{haveCgroup: r.haveCgroup()}
	for _, p := range all {
		if why := r.reusedLeader(p); why != "" {
			f.groupReused = true
			rejected = append(rejected, why)
		}
	}
	in := map[int]bool{}
	if f.haveCgroup {
		pids, _ := cgroup.Procs(r.Record.Cgroup)
		for _, p := range pids {
			in[p] = true
		}
	}
	f.inCgroup = func(pid int) bool { return in[pid] }
	desc := map[int]bool{}
	if r.Supervisor != 0 {
		// As subreaper, every orphan of the job is reparented to the
		// wrapper, so the tree below it is the job's whole tree.
		children := map[int][]int{}
		for _, p := range all {
			children[p.PPID] = append(children[p.PPID], p.PID)
		}
		queue := []int{r.Supervisor}
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
	}
	f.descendant = func(pid int) bool { return desc[pid] }
	f.escaped = make(map[int]uint64, len(r.Record.Escaped))
	for _, e := range r.Record.Escaped {
		f.escaped[e.PID] = e.Start
	}
	judged := map[int]bool{}
	for _, p := range all {
		m, ok, why := r.judge(p, f)
		if ok {
			members = append(members, m)
			judged[p.PID] = true
		} else if why != "" {
			rejected = append(rejected, why)
		}
	}
	if r.Supervisor == 0 && !f.haveCgroup {
		members = append(members, r.holders(all, judged)...)
		members = append(members, r.offspring(all, members, judged)...)
	}
	sort.Slice(members, func(i, j int) bool { return members[i].PID < members[j].PID })
	return members, rejected
}

// offspring returns, for a caller outside the wrapper of a run without a
// cgroup, the live processes forked below the run that no rule above
// found: a child of a member (a PPID is always a live parent, so the child
// is the member's own), and a child of the run's wrapper while that wrapper
// is alive with its recorded start time (as subreaper it holds the job's
// leader and every orphan of the job, and forks nothing else). So a job
// that left its session unrecorded, because its wrapper was stopped or
// slow, is still found while its parent, or the stopped wrapper, lives.
// One that a dead parent left to init is found only by the logs it holds
// (Run.Logs); one that also gave up the logs is not: that is what a cgroup
// is for.
func (r Run) offspring(all []proc.Stat, members []Member, judged map[int]bool) []Member {
	children := map[int][]proc.Stat{}
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var queue []int
	for _, m := range members {
		queue = append(queue, m.PID)
	}
	if WrapperAlive(r.Record) {
		queue = append(queue, r.Record.WrapperPID)
		judged[r.Record.WrapperPID] = true
	}
	var found []Member
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if judged[c.PID] || c.Dead() {
				continue
			}
			judged[c.PID] = true
			queue = append(queue, c.PID)
			found = append(found, Member{Stat: c, Escaped: true, Identity: proc.Identity{PID: c.PID, Start: c.Start}})
		}
	}
	return found
}

// Members reads the whole process table and returns Judge's answer.
func (r Run) Members() (members []Member, rejected []string, err error) {
	all, err := proc.Scan()
	if err != nil {
		return nil, nil, err
	}
	members, rejected = r.Judge(all)
	return members, rejected, nil
}

// CgroupMembers is Members for a run with a cgroup, at the cost of one read
// of cgroup.procs and one stat per member and per recorded escape, instead
// of every process on the host. ok is false when the run has no cgroup to go
// by or it cannot be read: the caller then uses Members. It reports no
// rejected processes (it does not look at processes outside the cgroup),
// and its members are the same as Members' but for a group member outside
// the cgroup, which only the run's own wrapper counts.
func (r Run) CgroupMembers() (members []Member, ok bool) {
	if !r.haveCgroup() {
		return nil, false
	}
	pids, err := cgroup.Procs(r.Record.Cgroup)
	if err != nil {
		return nil, false
	}
	f := &facts{haveCgroup: true, inCgroup: func(int) bool { return true }, descendant: func(int) bool { return false }}
	if r.Supervisor == 0 && r.Record.PID > 1 {
		if st, err := proc.ReadStat(r.Record.PID); err == nil && r.reusedLeader(st) != "" {
			f.groupReused = true
		}
	}
	seen := map[int]bool{}
	for _, pid := range pids {
		if pid == r.Supervisor {
			continue
		}
		p, err := proc.ReadStat(pid)
		if err != nil {
			continue
		}
		seen[pid] = true
		if m, ok, _ := r.judge(p, f); ok {
			members = append(members, m)
		}
	}
	f.inCgroup = func(int) bool { return false }
	for _, e := range r.Record.Escaped {
		if seen[e.PID] {
			continue
		}
		seen[e.PID] = true
		if p, err := proc.ReadStat(e.PID); err == nil {
			if m, ok, _ := r.judge(p, f); ok {
				members = append(members, m)
			}
		}
	}
	sort.Slice(members, func(i, j int) bool { return members[i].PID < members[j].PID })
	return members, true
}

// Contains reports whether the process at pid, which the caller saw with
// start time start (proc.ReadStat), is now a live process of the run. It
// reads a few files (the process's stat and cgroup, the leader's stat, and
// for the run's own wrapper the stats of the process's ancestors), never
// the whole process table, so a gateway can ask it for every request.
//
// nil means yes, with the member. An error wrapping ErrNotMember says why
// not: the process is gone or a zombie, has another start time (the PID was
// reused), the record is from another boot, or no rule above makes it the
// run's. Any other error (an unreadable /proc) is no answer, and a gateway
// refuses then too. start 0 is refused: a PID alone is a claim.
func (r Run) Contains(pid int, start uint64) (Member, error) {
	rec := r.Record
	no := func(format string, a ...any) (Member, error) {
		return Member{}, fmt.Errorf("pid %d: %w: "+format, append([]any{pid, ErrNotMember}, a...)...)
	}
	if start == 0 {
		return no("no start time given to check it against")
	}
	p, err := proc.ReadStat(pid)
	if errors.Is(err, proc.ErrGone) {
		return no("gone")
	}
	if err != nil {
		return Member{}, err
	}
	switch {
	case p.Start != start:
		return no("started at tick %d, not %d: another process now", p.Start, start)
	case p.Dead():
		return no("exited")
	}
	if r.Supervisor == 0 {
		if err := checkBoot(rec); err != nil {
			return no("%v", err)
		}
	}
	f := &facts{haveCgroup: r.haveCgroup()}
	if r.Supervisor == 0 && rec.PID > 1 && rec.PID != pid {
		if st, err := proc.ReadStat(rec.PID); err == nil && r.reusedLeader(st) != "" {
			f.groupReused = true
		}
	} else if why := r.reusedLeader(p); why != "" {
		f.groupReused = true
	}
	f.inCgroup = func(pid int) bool { return cgroupOf(pid) == rec.Cgroup }
	f.descendant = func(pid int) bool { return r.descends(pid) }
	m, ok, why := r.judge(p, f)
	if ok {
		return m, nil
	}
	if why != "" {
		return no("%s", why)
	}
	if r.Supervisor == 0 && !f.haveCgroup && r.forkedBelow(p, f) {
		return Member{Stat: p, Escaped: true, Identity: proc.Identity{PID: p.PID, Start: p.Start}}, nil
	}
	return no("not in the run's cgroup, process group or recorded escapes")
}

// forkedBelow is offspring's rule for one process: an ancestor of p is a
// member, or the run's live wrapper. It walks up at most 4096 parents.
func (r Run) forkedBelow(p proc.Stat, f *facts) bool {
	wrapperAlive := WrapperAlive(r.Record)
	for i := 0; i < 4096 && p.PPID > 1; i++ {
		if wrapperAlive && p.PPID == r.Record.WrapperPID {
			return true
		}
		up, err := proc.ReadStat(p.PPID)
		if err != nil {
			return false
		}
		if _, ok, _ := r.judge(up, f); ok {
			return true
		}
		p = up
	}
	return false
}

// descends reports whether pid is a descendant of r.Supervisor, walking up
// its parents (at most 4096 of them: a loop guard).
func (r Run) descends(pid int) bool {
	for i := 0; i < 4096 && pid > 1; i++ {
		st, err := proc.ReadStat(pid)
		if err != nil {
			return false
		}
		if st.PPID == r.Supervisor {
			return true
		}
		pid = st.PPID
	}
	return false
}
