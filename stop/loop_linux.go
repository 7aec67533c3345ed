package stop

import (
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
)

// killWait bounds how long KILL is repeated before the survivors are
// recorded. KILL cannot be caught; only a process stuck in the kernel
// (state D on a dead NFS mount, say) outlives it.
const killWait = 10 * time.Second

// killEvery is how long a KILL is given before it is sent again to what is
// left (a job forking while it is being stopped).
const killEvery = 500 * time.Millisecond

// Wake intervals while waiting for members to die: the first wait, and the
// most it grows to when nothing woke it.
const (
	firstWake = 5 * time.Millisecond
	maxWake   = 100 * time.Millisecond
)

// A Loop is the one way a run's processes are stopped, by the wrapper and
// from outside it: TERM to every member, wait until they are gone or the
// grace passes, then KILL what is left, again every killEvery, until
// nothing is left or killWait passes. "Gone" is always confirmed by a fresh
// look (Members) after the known members have died, and a member found then
// gets the signal of the phase (TERM during the grace, KILL after). The
// intent must be recorded before Run (see Intend).
type Loop struct {
	// Members returns the run's live members now (membership's answer).
	Members func() []membership.Member
	// Signal journals sig and sends it to ms. again is set when this stop
	// has sent sig before: ms are then late arrivals (TERM) or what is left
	// (KILL), and a signal to the whole group would repeat a TERM.
	Signal func(sig unix.Signal, ms []membership.Member, again bool)
	// Wake blocks until one of ms may have died, or for at most d. It
	// reports whether it was woken by an event rather than the time.
	Wake func(ms []membership.Member, d time.Duration) bool
}

// Run stops the members: it returns the PIDs it found alive at the start
// (stopped) and those that outlived KILL (survivors), sorted.
func (l Loop) Run(grace time.Duration) (stopped, survivors []int) {
	ms := l.Members()
	if len(ms) == 0 {
		return nil, nil
	}
	stopped = pids(ms)
	termed := map[proc.Identity]bool{}
	term := func(ms []membership.Member, again bool) {
		var fresh []membership.Member
		for _, m := range ms {
			if !termed[m.Identity] {
				termed[m.Identity] = true
				fresh = append(fresh, m)
			}
		}
		if len(fresh) > 0 {
			l.Signal(unix.SIGTERM, fresh, again)
		}
	}
	term(ms, false)
	ms = l.waitGone(time.Now().Add(grace), ms, func(late []membership.Member) { term(late, true) })
	until := time.Now().Add(killWait)
	for again := false; len(ms) > 0 && time.Now().Before(until); again = true {
		l.Signal(unix.SIGKILL, ms, again)
		ms = l.waitGone(time.Now().Add(killEvery), ms, nil)
	}
	return stopped, pids(ms)
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
		st, err := proc.ReadStat(m.PID)
		if err != nil || st.Start != m.Start || st.Dead() {
			continue
		}
		out = append(out, m)
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
