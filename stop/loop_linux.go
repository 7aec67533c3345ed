package stop

import (
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
)

// killWait bounds the proof: how long processes are frozen and KILLed
// before what is left is recorded as survivors. KILL cannot be caught;
// only a process stuck in the kernel (state D on a dead NFS mount, say)
// outlives it.
const killWait = 10 * time.Second

// Wake intervals while waiting for members to die: the first wait, and the
// most it grows to when nothing woke it.
const (
	firstWake = 5 * time.Millisecond
	maxWake   = 100 * time.Millisecond
)

// A Loop is the one way a run's processes are stopped, by the wrapper and
// from outside it, in two phases.
//
// The grace: TERM to every member, and to each member found later, until
// they are gone or the grace passes. "Gone" is a fresh look (Members) after
// the known members have died.
//
// The proof: every member found is frozen (SIGSTOP: a stopped process
// cannot fork) and then KILLed, and the run is looked at again, until two
// looks in a row find no member and Empty (when set) agrees both times, or
// killWait passes. A job that forks and calls setsid in a loop keeps making
// new PIDs that one look can miss; it cannot make them while frozen, and
// it cannot pass two looks and the caller's own proof (cgroup unpopulated,
// no child left) unseen. Sweep (when set) is called once when the proof
// begins, if the stop found a member and something is left after the
// grace (a member, or Empty disagreeing): the caller's last word
// (cgroup.kill). A stop whose TERM ended everything within the grace sends
// no KILL; the proof's two looks, each confirmed by Empty, still stand.
//
// The intent must be recorded before Run (see Intend).
type Loop struct {
	// Members returns the run's live members now (membership's answer).
	Members func() []membership.Member
	// Signal journals sig and sends it to ms. again is set when this stop
	// has sent sig before: ms are then late arrivals (TERM) or what is left
	// (STOP, KILL), and a signal to the whole group would repeat a TERM.
	Signal func(sig unix.Signal, ms []membership.Member, again bool)
	// Wake blocks until one of ms may have died, or for at most d. It
	// reports whether it was woken by an event rather than the time.
	Wake func(ms []membership.Member, d time.Duration) bool
	// Sweep, if set, ends every stop that found a member and left
	// something after the grace: it is called once, after the grace,
	// before the proof, when a member is left or Empty disagrees; and once
	// in the proof when a look finds no member but Empty disagrees.
	Sweep func()
	// Empty, if set, is the caller's proof that nothing of the run is left
	// where Members cannot see: the run's cgroup is unpopulated, its
	// subreaper has no live child. It is asked after a look found no
	// member; false sends the loop round again.
	Empty func() bool
}

// Result is what a stop did and what it saw at its end.
type Result struct {
	// Stopped are the PIDs found alive at the start, sorted.
	Stopped []int
	// Survivors are the PIDs still alive when killWait ran out, sorted.
	Survivors []int
	// Proven: the stop ended with two empty looks in a row, each confirmed
	// by Empty. Without it, an empty Survivors says only that no member
	// was seen, not that none is left.
	Proven bool
}

// proofWait is how long the proof waits, after a KILL, for the members it
// signalled to die before it looks again.
const proofWait = 100 * time.Millisecond

// Run stops the members and returns what it did (see Result).
func (l Loop) Run(grace time.Duration) Result {
	ms := l.Members()
	var res Result
	if len(ms) > 0 {
		res.Stopped = pids(ms)
		termed := map[proc.Identity]bool{}
		term := func(ms []membership.Member, again bool) {
			if fresh := unseen(termed, ms); len(fresh) > 0 {
				l.Signal(unix.SIGTERM, fresh, again)
			}
		}
		term(ms, false)
		ms = l.waitGone(time.Now().Add(grace), ms, func(late []membership.Member) { term(late, true) })
	}
	// The sweep is for what is left: a member the grace did not end, or
	// one no look can see but Empty knows of. A stop whose TERM ended
	// everything within the grace sends no KILL of any kind.
	swept := false
	if l.Sweep != nil && len(res.Stopped) > 0 && (len(ms) > 0 || l.Empty != nil && !l.Empty()) {
		l.Sweep()
		swept = true
	}
	left, proven := l.prove(ms, swept)
	res.Survivors, res.Proven = pids(left), proven
	return res
}

// prove is the second phase: freeze and KILL what is found, until two
// looks in a row find nothing and Empty agrees, or killWait passes. ms are
// the members left from the grace (nil: look first); swept says Sweep has
// been called. When Empty disagrees with a look that found nothing (the
// cgroup holds a process no look can see, in a cgroup of its own below
// the run's, say), Sweep is called then, once.
func (l Loop) prove(ms []membership.Member, swept bool) (left []membership.Member, proven bool) {
	until := time.Now().Add(killWait)
	empty, again := 0, false
	killed := map[proc.Identity]bool{}
	for {
		if len(ms) == 0 {
			if l.Empty == nil || l.Empty() {
				empty++
				if empty >= 2 {
					return nil, true
				}
			} else {
				empty = 0
				if !time.Now().Before(until) {
					return nil, false
				}
				if l.Sweep != nil && !swept {
					l.Sweep()
					swept = true
				}
				l.Wake(nil, firstWake)
			}
		} else {
			empty = 0
			if !time.Now().Before(until) {
				return ms, false
			}
			// A member KILLed already is dying or stuck in the kernel
			// (state D): signalling it again changes nothing.
			if fresh := unseen(killed, ms); len(fresh) > 0 {
				l.Signal(unix.SIGSTOP, fresh, again)
				l.Signal(unix.SIGKILL, fresh, again)
				again = true
			}
			l.waitDead(time.Now().Add(proofWait), ms)
		}
		ms = l.Members()
	}
}

// waitDead waits until none of ms is alive, or until the deadline.
func (l Loop) waitDead(until time.Time, ms []membership.Member) {
	wait := firstWake
	for ms = alive(ms); len(ms) > 0; ms = alive(ms) {
		left := time.Until(until)
		if left <= 0 {
			return
		}
		if !l.Wake(ms, min(wait, left)) && wait < maxWake {
			wait *= 2
		}
	}
}

// waitGone waits until no member is alive or until the deadline. When the
// known members have died it looks again, and hands what it finds to late
// (if set) before waiting for it too.
func (l Loop) waitGone(until time.Time, ms []membership.Member, late func([]membership.Member)) []membership.Member {
	wait := firstWake
	for {
		if len(ms) == 0 {
			return nil
		}
		left := time.Until(until)
		if left <= 0 {
			return ms
		}
		if !l.Wake(ms, min(wait, left)) && wait < maxWake {
			wait *= 2
		}
		ms = alive(ms)
		if len(ms) == 0 {
			if ms = l.Members(); len(ms) > 0 && late != nil {
				late(ms)
			}
		}
	}
}

// alive keeps the members that are still alive, reading only their own
// /proc/PID/stat.
func alive(ms []membership.Member) []membership.Member {
	var out []membership.Member
	for _, m := range ms {
		if m.Start != 0 && proc.Alive(m.PID, m.Start) {
			out = append(out, m)
		}
	}
	return out
}

// pids lists the members' PIDs, sorted.
func pids(ms []membership.Member) []int {
	out := make([]int, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.PID)
	}
	sort.Ints(out)
	return out
}

// PollWake is a Loop's Wake for a caller that is not the members' parent
// (no SIGCHLD reaches it): it waits on a pidfd of each member, which the
// kernel makes readable when the process exits (Linux 5.3), and where
// pidfd_open is missing it sleeps, and the Loop reads /proc again.
func PollWake(ms []membership.Member, d time.Duration) bool {
	fds := make([]unix.PollFd, 0, len(ms))
	defer func() {
		for _, p := range fds {
			unix.Close(int(p.Fd))
		}
	}()
	for _, m := range ms {
		fd, err := unix.PidfdOpen(m.PID, 0)
		if err == unix.ESRCH {
			return true // gone already
		}
		if err != nil {
			time.Sleep(d) // no pidfds here (ENOSYS), or out of descriptors
			return false
		}
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	n, err := unix.Poll(fds, max(int(d/time.Millisecond), 1))
	return err == nil && n > 0 || err == unix.EINTR
}

// unseen returns the members of ms not in seen, and adds them to it: the
// ones a signal has not been sent to yet.
func unseen(seen map[proc.Identity]bool, ms []membership.Member) []membership.Member {
	var fresh []membership.Member
	for _, m := range ms {
		if !seen[m.Identity] {
			seen[m.Identity] = true
			fresh = append(fresh, m)
		}
	}
	return fresh
}
