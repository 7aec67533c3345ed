package membership

import (
	"errors"
	"os"
	"strconv"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// rangeLimit is the most new PIDs a Tracker looks at one by one; past it
// (or when the PIDs have wrapped around pid_max) it reads the whole table,
// which costs about as much.
const rangeLimit = 1024

// A Tracker answers Members for the run's own wrapper (Run.Supervisor) when
// the run has no cgroup, at a cost that grows with the run rather than with
// the host: it keeps the members it found and, at each look, reads only
// what could have changed since the last one. A wrapper looks every second
// for as long as its run lives; a host with N quiet runs then does N small
// looks a second instead of N reads of every process.
//
// What it relies on, all of it kernel fact:
//
//   - a process of the run comes from a fork by another process of the run
//     (the subreaper keeps every descendant under the wrapper), and a new
//     process takes a new PID: no new PID since the last look (ns_last_pid,
//     see proc.LastPID) means no new process, and else only the PIDs handed
//     out since then are new;
//   - a process that did not run did nothing: it did not fork, exit, or
//     leave its group or session. Each member's run time (proc.RunTime, of
//     every thread of a member with several) is compared with the last
//     look's; while none has moved over two looks in a row, the new PIDs
//     of that time are not the run's, and the look reads nothing more.
//
// So a look reads the last PID and each member's run time, and only when a
// member ran or appeared, the members' stats and the new PIDs' (just their
// range: the relevant ones, children of the run or of its group, are handed
// to Run.Judge with the members, which decides as it would over the whole
// table). It reads the whole table (proc.Scan) at its first look, when the
// PIDs wrapped around or too many are new, when the kernel keeps no run
// times (then it looks at the new PIDs whenever there are any), and at every
// look when it cannot read the last PID or /proc is not of its own PID
// namespace.
//
// A Tracker reads the run's record (Run.Record) at each look, like Judge;
// it is not safe for concurrent use. Its looks make next to no garbage.
type Tracker struct {
	run Run

	known   []tracked // the members at the last look, as their run times were then
	members []Member  // the last answer
	started bool      // the first, whole look was made

	last     int               // the last PID the last look covered
	settled  bool              // the last look found every member as the one before, and no new one
	byRange  bool              // new PIDs can be looked at one by one (LastPID works, /proc is ours)
	lastPID  *proc.LastPIDFile // ns_last_pid, kept open for the tracker's life
	runTimes bool              // the kernel keeps run times

	table []proc.Stat     // reused: what a look read, to be judged
	mine  map[int]bool    // reused: PIDs of the table (members and relevant new ones)
	tids  []int           // reused: a member's thread IDs
	prev  map[int]tracked // reused: the known members by PID while the new ones are built
	looks LookCounts
}

// LookCounts counts a Tracker's looks by what they read.
type LookCounts struct {
	// Quiet looks read the last PID and the members' run times only.
	Quiet int
	// Range looks also read the members' stats and the new PIDs'.
	Range int
	// Whole looks read every process (proc.Scan).
	Whole int
}

// tracked is a member as the tracker last saw it.
type tracked struct {
	pid     int
	start   uint64
	threads int
	rt      proc.RunTime // summed over its threads
	tasks   int          // how many threads were summed
}

// NewTracker returns a Tracker for r, which must name its Supervisor (the
// caller's own PID). It looks at nothing yet; it keeps ns_last_pid open
// for its life, which is the wrapper's.
func NewTracker(r Run) *Tracker {
	t := &Tracker{run: r, mine: map[int]bool{}, prev: map[int]tracked{}}
	if f, err := proc.OpenLastPID(); err == nil && ownPIDNamespace() {
		t.byRange, t.lastPID = true, f
	} else if err == nil {
		f.Close()
	}
	t.runTimes = proc.RunTimeKept()
	return t
}

// ownPIDNamespace reports whether /proc shows this process's own PID
// namespace, the one ns_last_pid counts in.
func ownPIDNamespace() bool {
	self, err := os.Readlink("/proc/self")
	return err == nil && self == strconv.Itoa(os.Getpid())
}

// Counts returns how many looks of each kind the tracker has made.
func (t *Tracker) Counts() LookCounts { return t.looks }

// Look returns the run's live members, as Run.Members would (rejected
// processes aside), reading as little as it can (see Tracker). The slice is
// the tracker's own, valid until the next Look; it is not to be changed.
// An error is an unreadable /proc: the last answer is kept.
func (t *Tracker) Look() ([]Member, error) {
	if t.run.Supervisor == 0 {
		return nil, errors.New("membership: a Tracker is for the run's own wrapper (Run.Supervisor)")
	}
	if !t.byRange {
		return t.whole(0)
	}
	// The last PID is read before the run times: a process the run forks
	// after this read has a later PID, which the next look covers (this
	// one finds the run changed).
	cur, err := t.lastPID.Read()
	if err != nil {
		return t.whole(0)
	}
	if !t.started {
		return t.whole(cur)
	}
	quiet := t.runTimes && t.still()
	if quiet && t.settled {
		// Nothing of the run has run since before the last look read its
		// last PID: none of the PIDs handed out since is the run's.
		t.last = cur
		t.looks.Quiet++
		return t.members, nil
	}
	n := cur - t.last
	if n < 0 || n > rangeLimit {
		return t.whole(cur) // wrapped around pid_max, or many new
	}
	t.looks.Range++
	table := t.table[:0]
	clear(t.mine)
	for _, k := range t.known {
		p, err := proc.ReadStat(k.pid)
		if err != nil {
			continue // gone
		}
		table = append(table, p)
		t.mine[p.PID] = true
	}
	rec := t.run.Record
	for pid := t.last + 1; pid <= cur; pid++ {
		p, err := proc.ReadStat(pid)
		if err != nil || t.mine[pid] {
			continue // no process there (or a member already read)
		}
		relevant := p.PPID == t.run.Supervisor || t.mine[p.PPID] ||
			rec.PGID > 1 && p.PGID == rec.PGID && p.SID == rec.SID || escapedPID(rec, pid)
		if !relevant {
			continue
		}
		if p.Threads > 1 {
			// /proc/TID/stat answers for a thread too, with the
			// process's group, session and parent: only a process is a
			// member.
			if ok, err := proc.IsProcess(pid); err != nil || !ok {
				continue
			}
		}
		table = append(table, p)
		t.mine[p.PID] = true
	}
	t.table = table
	t.last = cur
	members, _ := t.run.Judge(table)
	added := t.remember(members)
	t.settled = quiet && !added
	return t.members, nil
}

// whole reads every process and judges them all; cur is the last PID read
// before, 0 if unknown. It judges only what could be the run's (ofRun), so
// that Judge's tree of the whole host is not built, and it reads into the
// tracker's own table: a wrapper that never collects its garbage would
// otherwise keep every whole look's table, names and tree.
func (t *Tracker) whole(cur int) ([]Member, error) {
	rec := t.run.Record
	all, err := proc.ScanInto(t.table, func(p proc.Stat) bool {
		// Every process below the wrapper has a parent below it or the
		// wrapper itself; children of init (unless the wrapper is init)
		// and kernel threads are not the run's, unless by group or as a
		// recorded escape, which Judge decides.
		return p.PPID > 2 || p.PPID == t.run.Supervisor ||
			rec.PGID > 1 && p.PGID == rec.PGID || escapedPID(rec, p.PID)
	})
	t.table = all
	if err != nil {
		return t.members, err
	}
	t.looks.Whole++
	t.started = true
	t.last = cur
	t.table = t.ofRun(all)
	members, _ := t.run.Judge(t.table)
	t.remember(members)
	t.settled = false
	return t.members, nil
}

// ofRun keeps, in place, the processes of table that Judge could find the
// run's for its wrapper: the wrapper's descendants (as subreaper, the job's
// whole tree), those with the run's process group, and recorded escapes.
// Judge over them answers as over the whole table.
func (t *Tracker) ofRun(table []proc.Stat) []proc.Stat {
	rec := t.run.Record
	clear(t.mine)
	t.mine[t.run.Supervisor] = true
	// Parents before children: each pass adds the children of what the
	// last one found, so a tree of depth d takes d+1 passes.
	for grew := true; grew; {
		grew = false
		for _, p := range table {
			if !t.mine[p.PID] && t.mine[p.PPID] {
				t.mine[p.PID], grew = true, true
			}
		}
	}
	out := table[:0]
	for _, p := range table {
		if p.PID != t.run.Supervisor && (t.mine[p.PID] || rec.PGID > 1 && p.PGID == rec.PGID || escapedPID(rec, p.PID)) {
			out = append(out, p)
		}
	}
	return out
}

// escapedPID reports whether rec records an escape at pid.
func escapedPID(rec *statusfile.Record, pid int) bool {
	for _, e := range rec.Escaped {
		if e.PID == pid {
			return true
		}
	}
	return false
}

// still reads every known member's run time, keeps it, and reports whether
// all of them are as at the last look: none ran, exited or is gone.
func (t *Tracker) still() bool {
	same := true
	for i := range t.known {
		k := &t.known[i]
		rt, tasks, err := t.runTime(k.pid, k.threads)
		if err != nil {
			same = false
			continue
		}
		if rt != k.rt || tasks != k.tasks {
			same = false
		}
		k.rt, k.tasks = rt, tasks
	}
	return same
}

// runTime is pid's run time: its main thread's, or with several threads
// the sum over all of them, and how many were summed.
func (t *Tracker) runTime(pid, threads int) (proc.RunTime, int, error) {
	if threads <= 1 {
		rt, err := proc.ReadRunTime(pid)
		return rt, 1, err
	}
	var err error
	t.tids, err = proc.TaskIDs(pid, t.tids[:0])
	if err != nil {
		return proc.RunTime{}, 0, err
	}
	var sum proc.RunTime
	n := 0
	for _, tid := range t.tids {
		rt, err := proc.ReadThreadRunTime(pid, tid)
		if err != nil {
			continue // a thread that ended: the count tells
		}
		sum.NS += rt.NS
		sum.Slices += rt.Slices
		n++
	}
	return sum, n, nil
}

// remember makes members the tracker's answer and its known set, each
// member's run time as read by still at this look or, for a new one, now.
// It reports whether any member is new.
func (t *Tracker) remember(members []Member) (added bool) {
	clear(t.prev)
	for _, k := range t.known {
		t.prev[k.pid] = k
	}
	t.known = t.known[:0]
	for _, m := range members {
		k, ok := t.prev[m.PID]
		if !ok || k.start != m.Start || k.threads != m.Threads {
			added = added || !ok || k.start != m.Start
			k = tracked{pid: m.PID, start: m.Start, threads: m.Threads}
			k.rt, k.tasks, _ = t.runTime(m.PID, m.Threads)
		}
		t.known = append(t.known, k)
	}
	t.members = append(t.members[:0], members...)
	return added
}
