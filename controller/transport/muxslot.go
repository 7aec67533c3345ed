package transport

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// A call's session on one of a destination's masters (mux.go): which
// slot's master takes it, a full or dead master passed over or replaced,
// and the claim of a free slot to start a master in (muxmaster.go).

func (m *mux) sock(slot int) string { return m.base + "." + strconv.Itoa(slot) }

// clientOpts are a session client's options, placed before the user's
// words (ssh takes the first value it is given). ControlMaster=no: a client
// never becomes a master by itself. ProxyCommand=false: a client whose
// master refuses the session (full, or dead) fails at once, before any
// command ran, instead of opening a connection of its own.
func (m *mux) clientOpts(slot int) []string {
	return []string{"-o", "ControlMaster=no", "-o", "ControlPath=" + m.sock(slot), "-o", "ProxyCommand=false"}
}

// muxWaitDelay bounds how long a call waits for its session's pipes
// after its client exited: the master closes them as the session ends.
const muxWaitDelay = time.Second

// Markers of a session that never started, in a client's -E log.
const (
	// The master's sshd refused the channel (MaxSessions).
	markFull = "session request failed"
	// The ProxyCommand=false failed: the client could not have its
	// session from the master (full, dead or gone) and tried a connection
	// of its own. A client that had its session never does a key exchange.
	markFallback = "kex_exchange_identification"
)

// call runs line as a session on one of the masters, starting or replacing
// one as needed, with a ticket of that master held for as long as its
// client runs (muxticket.go). A session refused by a full master, or by a
// dead one, is tried again on another: the remote command had not started.
func (m *mux) call(ctx context.Context, h *Host, line string, stdin *os.File, stdout, stderr io.Writer) Result {
	long := isLongSession(ctx)
	tried := map[int]bool{}
	dead := map[int]int{}
	for attempt := 0; attempt < 2*maxMasters; attempt++ {
		t, res := m.pick(ctx, h, tried, long)
		if res != nil {
			return *res
		}
		if t == nil {
			break // every master is full: a connection of its own
		}
		slot := t.slot
		r := h.exec(ctx, m.clientOpts(slot), line, stdin, stdout, stderr)
		if r.Code == 255 && strings.Contains(r.FullLog, markFull) {
			m.learnCap(t) // it counts the others, then lets t go
		}
		t.release()
		if r.Lost() && !strings.Contains(r.FullLog, markFallback) {
			// A session lost, or killed by its caller (a cancel, a
			// timeout): its master may be dead or stuck (a network that
			// went silent under it, which its keepalives notice only
			// later). The next calls of this process go to another master,
			// a new one if need be, and are not held up by it.
			m.avoid(slot, suspectFor)
		}
		if r.Code != 255 || ctx.Err() != nil || !strings.Contains(r.FullLog, markFallback) {
			// The session ran, or may have: its result. A session on a
			// master has no login of its own, so no "Authenticated to"
			// line can say the command was not sent (mayHaveSent).
			r.ViaMux = true
			if r.Code == 255 && r.SSHLog == "" {
				r.SSHLog = "the session's ssh ControlMaster ended"
			}
			return r
		}
		if strings.Contains(r.FullLog, markFull) {
			m.avoid(slot, fullFor)
			m.sayFull(slot)
			tried[slot] = true
			continue
		}
		// Else the master is dead or gone: pick replaces it (its socket
		// no longer answers); one that still answers but fails twice is
		// passed over.
		if dead[slot]++; dead[slot] >= 2 {
			tried[slot] = true
		}
	}
	return h.exec(ctx, nil, line, stdin, stdout, stderr)
}

// avoid passes slot over for d in this process.
func (m *mux) avoid(slot int, d time.Duration) {
	m.mu.Lock()
	if until := time.Now().Add(d); until.After(m.full[slot]) {
		m.full[slot] = until
	}
	m.mu.Unlock()
}

// isFull reports whether slot is passed over: by this process (full or
// suspect), or because any controller found it full in the last fullFor
// (HASH.N.full, see sayFull).
func (m *mux) isFull(slot int) bool {
	m.mu.Lock()
	local := time.Now().Before(m.full[slot])
	m.mu.Unlock()
	if local {
		return true
	}
	fi, err := os.Stat(m.sock(slot) + ".full")
	return err == nil && time.Since(fi.ModTime()) < fullFor
}

// sayFull tells every controller that slot's master refused a session:
// HASH.N.full, its time the moment. Without it, in a burst of runs, each
// controller would learn it by a refused session of its own, and the
// callers queued for the lock would each take the newest master (full
// again by then) for one with room, instead of starting the next one.
func (m *mux) sayFull(slot int) {
	p := m.sock(slot) + ".full"
	if f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
		f.Close()
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now)
}

// slots lists the slots that have a socket file, in the order to try them:
// rotated, so that the runs of many processes spread over the masters.
func (m *mux) slots() []int {
	names, _ := filepath.Glob(m.base + ".*")
	var s []int
	for _, n := range names {
		if i, err := strconv.Atoi(strings.TrimPrefix(n, m.base+".")); err == nil && i >= 0 && i < maxMasters {
			s = append(s, i)
		}
	}
	sort.Ints(s)
	if len(s) > 1 {
		m.mu.Lock()
		k := (m.next + os.Getpid()) % len(s)
		m.next++
		m.mu.Unlock()
		s = append(s[k:], s[:k]...)
	}
	return s
}

// pick returns a ticket of a live master for a call of its kind (long or
// short, see muxticket.go), starting a master when none has a ticket free:
// in the first slot with neither a live master nor one being started. Up
// to maxStarting masters of a destination are started at once (each marked
// HASH.N.starting by its starter, under the destination's lock, which is
// not held during the handshake): a burst of hundreds of runs needs tens of
// masters, and one at a time each handshake would be waited for in turn,
// while a few at once stay far below sshd's MaxStartups. A long call that
// finds no ticket waits in line (HASH.queue) for its turn to look. nil and
// no result: every slot is taken and full. A non-nil result is a master
// that could not be started (a connection that failed, as a call's would).
func (m *mux) pick(ctx context.Context, h *Host, tried map[int]bool, long bool) (*ticket, *Result) {
	if t := m.freeTicket(tried, long); t != nil {
		return t, nil
	}
	unqueue := func() {}
	if long {
		unlock, err := lockFile(ctx, m.base+".queue", syscall.LOCK_EX)
		if err != nil {
			return nil, lockFailed(ctx, "the ControlMaster queue", err)
		}
		var once sync.Once
		unqueue = func() { once.Do(unlock) }
	}
	defer unqueue()
	wait := 5 * time.Millisecond
	for {
		if t := m.freeTicket(tried, long); t != nil {
			return t, nil
		}
		t, slot, res := m.claimSlot(ctx, tried, long)
		switch {
		case res != nil || t != nil:
			return t, res
		case slot == -1:
			return nil, nil
		case slot >= 0:
			// Claimed: the next in line may start another meanwhile.
			unqueue()
			res := m.start(ctx, h, slot)
			os.Remove(m.sock(slot) + ".starting")
			if res.Code != 0 || res.Err != nil {
				return nil, &res
			}
			if t := m.takeTicket(slot, long); t != nil {
				return t, nil
			}
			continue
		}
		// maxStarting are being started: one of them, soon.
		tm := time.NewTimer(wait)
		wait = min(2*wait, 100*time.Millisecond)
		select {
		case <-ctx.Done():
			tm.Stop()
			return nil, &Result{Code: -1, SSHLog: "waiting for a ControlMaster: " + ctx.Err().Error(), NoLog: true}
		case <-tm.C:
		}
	}
}

// lockFailed is the result of a call that could not take one of the
// destination's locks: nothing was sent, no client was started.
func lockFailed(ctx context.Context, what string, err error) *Result {
	res := Result{Code: 255, SSHLog: what + " lock: " + err.Error(), NoLog: true}
	if ctx.Err() != nil {
		res.Code = -1
	}
	return &res
}

// maxStarting bounds the masters of a destination being started at once.
const maxStarting = 2

// claimSlot, under the destination's lock, returns a ticket of a master
// that another caller started meanwhile, or marks the first free slot as
// being started by this process and returns it, claimed; -2: maxStarting
// are being started, wait; -1: no slot left.
func (m *mux) claimSlot(ctx context.Context, tried map[int]bool, long bool) (t *ticket, slot int, res *Result) {
	unlock, err := lockFile(ctx, m.base+".lock", syscall.LOCK_EX)
	if err != nil {
		return nil, 0, lockFailed(ctx, "the ControlMaster", err)
	}
	defer unlock()
	if t := m.freeTicket(tried, long); t != nil {
		return t, 0, nil
	}
	starting, free := 0, -1
	for s := 0; s < maxMasters; s++ {
		switch {
		case m.beingStarted(s):
			starting++
		case free < 0 && !sockAlive(m.sock(s)):
			free = s
		}
	}
	switch {
	case starting >= maxStarting:
		return nil, -2, nil
	case free < 0 && starting > 0:
		return nil, -2, nil
	case free < 0:
		return nil, -1, nil
	}
	os.Remove(m.sock(free)) // a dead master's socket
	st, _ := proc.ReadStat(os.Getpid())
	if err := os.WriteFile(m.sock(free)+".starting", []byte(fmt.Sprintf("%d %d\n", os.Getpid(), st.Start)), 0o600); err != nil {
		return nil, 0, &Result{Code: 255, SSHLog: "the ControlMaster slot: " + err.Error(), NoLog: true}
	}
	return nil, free, nil
}

// beingStarted reports whether slot's master is being started: its
// HASH.N.starting names a live controller process and is younger than a
// handshake may take.
func (m *mux) beingStarted(slot int) bool {
	p := m.sock(slot) + ".starting"
	fi, err := os.Stat(p)
	if err != nil {
		return false
	}
	pid, start, ok := readPIDFile(p)
	if !ok || !proc.Alive(pid, start) || time.Since(fi.ModTime()) > 2*time.Minute {
		os.Remove(p) // of a controller that died while it started one
		return false
	}
	return true
}
