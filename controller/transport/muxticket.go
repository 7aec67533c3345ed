package transport

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/agent-wrap/agent-wrap/internal/flock"
)

// Session tickets (with mux.go): how many sessions each master carries,
// known to every controller process of the user on this machine without
// asking the master or the host.
//
//   - Each session holds an flock on one of its master's ticket files,
//     DIR/HASH.N.tK, from before its client starts until the client has
//     exited. A client that dies lets go with it: the kernel drops the
//     lock. So a master whose tickets are all held is known to be full
//     and is passed over without a session refused by the host. Before
//     tickets, a burst of hundreds of runs learned that a new master was
//     full by each trying it (a herd of clients, all but ten refused,
//     every time a master came up), and the next master was started only
//     after that: at 200 runs on two loaded CPUs, masters took tens of
//     seconds each to come, and launches passed --give-up waiting.
//   - A master has sessionCap tickets: OpenSSH's default MaxSessions (10),
//     or, once a session was refused with fewer sessions open, that many
//     (HASH.N.cap, see learnCap): a host with a lower MaxSessions costs one
//     refused session per master, not one per call.
//   - The last ticket of each master is kept for short calls (a renewal, a
//     cancel, a verdict): long sessions (a launch and the attach it becomes,
//     a reattach; marked by longSession) take the others only. Without it,
//     the launches of a burst fill every session of every master and the
//     running runs' renewals wait behind them, until their leases go.
//   - Long callers that find no ticket wait in line, one at a time, on the
//     destination's queue lock (DIR/HASH.queue): only the first in line
//     looks for a ticket or starts a master, so that hundreds waiting do
//     not all poll the tickets and all rush a master when it comes up.

// defaultMaxSessions is OpenSSH's default MaxSessions: the tickets of a
// master until a refusal says the host allows fewer.
const defaultMaxSessions = 10

type longKey struct{}

// longSession marks ctx's call as a long session (a launch, an attach):
// it leaves each master's last ticket to short calls.
func longSession(ctx context.Context) context.Context {
	return context.WithValue(ctx, longKey{}, true)
}

func isLongSession(ctx context.Context) bool {
	v, _ := ctx.Value(longKey{}).(bool)
	return v
}

// ticket is a held session ticket of one master.
type ticket struct {
	f    *os.File
	slot int
	idx  int
}

// release lets the ticket go: its session's client has exited.
func (t *ticket) release() {
	if t != nil && t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

func (m *mux) ticketPath(slot, k int) string {
	return m.sock(slot) + ".t" + strconv.Itoa(k)
}

// sessionCap returns the number of sessions slot's master may carry.
func (m *mux) sessionCap(slot int) int {
	b, err := os.ReadFile(m.sock(slot) + ".cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 1 && n <= defaultMaxSessions {
			return n
		}
	}
	return defaultMaxSessions
}

// ticketOrder lists the tickets a call may take, in the order to try them:
// a long session all but the last; a short call the last first.
func ticketOrder(capacity int, long bool) []int {
	if capacity <= 1 {
		return []int{0}
	}
	var ks []int
	if !long {
		ks = append(ks, capacity-1)
	}
	for k := 0; k < capacity-1; k++ {
		ks = append(ks, k)
	}
	return ks
}

// takeTicket takes a free ticket of slot's master for a call of its kind,
// or returns nil when none is free.
func (m *mux) takeTicket(slot int, long bool) *ticket {
	for _, k := range ticketOrder(m.sessionCap(slot), long) {
		f, err := os.OpenFile(m.ticketPath(slot, k), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil
		}
		if flock.Lock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			return &ticket{f: f, slot: slot, idx: k}
		}
		f.Close()
	}
	return nil
}

// heldTickets counts the tickets of slot's master that others hold.
func (m *mux) heldTickets(slot int, mine *ticket) int {
	n := 0
	for k := 0; k < defaultMaxSessions; k++ {
		if mine != nil && k == mine.idx {
			continue
		}
		f, err := os.OpenFile(m.ticketPath(slot, k), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if flock.Lock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			n++
		}
		f.Close()
	}
	return n
}

// learnCap answers a session that slot's master refused (the host's
// MaxSessions reached) while the caller held t, and lets t go (its client
// has exited): with n sessions open beside it, the host allows at most n,
// and the master's cap comes down to n.
//   - The count and the letting go are done under a lock of the socket
//     directory. So of the calls refused by one master at one moment, the
//     last to count no longer sees the others' tickets: without the lock,
//     two calls refused together each counted the other, and the cap they
//     learned was one above the host's limit, for the master's life.
//   - The count may still be high: a request on its way to the same
//     refusal holds a ticket too. Its own refusal lowers the cap again, so
//     the cap comes to the host's limit from above, and only comes down.
//   - It may be low: a session whose client was killed lives on in the
//     host until its command ends, without a ticket; a session may have
//     ended since the refusal. That master then carries fewer sessions
//     than it could, until it is replaced.
//
// Never below 1; forgotten with the master.
func (m *mux) learnCap(t *ticket) {
	d, err := os.Open(filepath.Dir(m.base))
	if err != nil {
		t.release()
		return
	}
	defer d.Close() // the lock goes with it, after t
	defer t.release()
	if flock.Lock(int(d.Fd()), syscall.LOCK_EX) != nil {
		return
	}
	n := m.heldTickets(t.slot, t)
	if n < 1 || n >= m.sessionCap(t.slot) {
		return
	}
	p := m.sock(t.slot) + ".cap"
	tmp := p + ".tmp" + strconv.Itoa(os.Getpid())
	if os.WriteFile(tmp, []byte(strconv.Itoa(n)+"\n"), 0o600) == nil {
		if os.Rename(tmp, p) != nil {
			os.Remove(tmp)
		}
	}
}

// freeTicket takes a ticket on a live master that is not passed over
// (tried by this call, or full: see isFull), or returns nil.
func (m *mux) freeTicket(tried map[int]bool, long bool) *ticket {
	for _, s := range m.slots() {
		if tried[s] || m.isFull(s) {
			continue
		}
		t := m.takeTicket(s, long)
		if t == nil {
			continue
		}
		if sockAlive(m.sock(s)) {
			return t
		}
		t.release()
	}
	return nil
}

// removeSlotFiles removes what a master leaves beside its socket: its
// tickets and its learned cap (a new master starts with none).
func (m *mux) removeSlotFiles(slot int) {
	for k := 0; k < defaultMaxSessions; k++ {
		os.Remove(m.ticketPath(slot, k))
	}
	os.Remove(m.sock(slot) + ".cap")
}
