package transport

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/flock"
	"github.com/agent-wrap/agent-wrap/internal/privsock"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The controller's own OpenSSH ControlMasters (--mux auto): every call to
// a destination is a session on a master connection that agent-wrap
// started, so a host sees a handful of connections however many runs are
// in flight, and a reattach or a renewal costs a session, not a handshake.
//
//   - Where: a socket per master, DIR/HASH.N, DIR a 0700 directory of the
//     user's ($AGENT_WRAP_MUX_DIR, else $XDG_RUNTIME_DIR/agent-wrap-mux,
//     else /tmp/agent-wrap-mux-UID), HASH naming the rsh words and the
//     destination (two configurations never share a master), N the slot.
//     Beside it HASH.N.pid (the master's PID and start time, as `ssh -O
//     check` reports it), HASH.N.log (its -E log) and HASH.N.full (the
//     last time a controller found it full).
//   - Who starts one: the first call that finds no master with room. It
//     claims the slot under an flock on DIR/HASH.lock (HASH.N.starting),
//     so that the controllers of one machine start at most maxStarting
//     masters at a time per destination (a burst of runs never meets
//     sshd's MaxStartups). `ssh -M -N -o ControlPersist=60` returns
//     once the master is up; it lives on in the background, shared by
//     every controller process of the user on this machine.
//   - Who stops it: the last controller process using the destination.
//     Each holds a shared flock on DIR/HASH.users while it has runs there;
//     when its last run ends it lets go and takes that lock exclusively if
//     it can (no other controller uses the destination), and then ends
//     every master with `ssh -O exit` on its socket (and, if one lingers,
//     SIGKILL to its recorded PID, checked against its start time). Never
//     by name. A controller killed with KILL stops nothing: its masters
//     end 60 s after their last session (ControlPersist).
//   - A full master (sshd's MaxSessions reached: "session request failed")
//     is answered by trying the next, and by starting a new one when every
//     master is full. A dead one (its socket refuses or is gone) is
//     replaced at once. Both are known before the remote command ran: the
//     clients carry -o ProxyCommand=false, so a client whose master cannot
//     take the session fails at once instead of falling back to a
//     connection of its own (see clientOpts). A user's ProxyJump (-J)
//     cannot be combined with that ProxyCommand: there is no mux then.
//   - A master that dies mid-run ends its sessions (ssh exits 255): to
//     Follow that is a lost connection, and the reattach's call (at once,
//     see backoff) finds the socket dead and replaces the master.

// Mux modes of Config.Mux.
const (
	MuxAuto = "auto" // agent-wrap's own ControlMasters unless the user set a ControlPath (the default)
	MuxOff  = "off"  // one connection per call, as the rsh makes it
)

// muxPersist is how long a master outlives its last session: the bound on
// a master of controllers that were all killed.
const muxPersist = "60"

// maxMasters bounds the masters per destination; past it, calls make
// connections of their own.
const maxMasters = 64

// fullFor is how long a master that refused a session is passed over;
// suspectFor, one whose session was lost or killed (about the time the
// default keepalives take to notice a dead connection).
const (
	fullFor    = 2 * time.Second
	suspectFor = 30 * time.Second
)

// mux is the set of masters of one destination (one rsh and dest), shared
// by every run of this process that goes there.
type mux struct {
	base  string // DIR/HASH; sockets are base.N
	guard bool   // clients carry ProxyCommand=false (not with a user's ProxyJump)
	ssh   string // the rsh's program, for -O commands

	mu    sync.Mutex
	full  map[int]time.Time // slot -> passed over until (full or suspect)
	next  int               // rotates the first slot tried
	refs  int               // this process's hosts using the masters
	users *os.File          // HASH.users, flocked shared while refs > 0
}

var (
	muxesMu sync.Mutex
	muxes   = map[string]*mux{} // base -> mux
)

// MuxDir returns the default directory of the masters' sockets:
// $AGENT_WRAP_MUX_DIR, else $XDG_RUNTIME_DIR/agent-wrap-mux, else
// /tmp/agent-wrap-mux-UID.
func MuxDir(getenv func(string) string) string {
	if d := getenv("AGENT_WRAP_MUX_DIR"); d != "" {
		return d
	}
	if rt := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(rt) {
		return filepath.Join(rt, "agent-wrap-mux")
	}
	return "/tmp/agent-wrap-mux-" + strconv.Itoa(os.Geteuid())
}

// ErrMux is returned (wrapped) by Start when the masters' socket directory
// cannot be used, or Config.Mux is not a mode.
var ErrMux = errors.New("mux")

// SetMux applies a mux mode (MuxAuto, "" too, or MuxOff) and the
// masters' socket directory ("": MuxDir(os.Getenv)) to h.
func (h *Host) SetMux(mode, dir string) error {
	switch mode {
	case MuxOff:
		return nil
	case "", MuxAuto:
	default:
		return fmt.Errorf("%w: --mux %q: want %s or %s", ErrMux, mode, MuxAuto, MuxOff)
	}
	if dir == "" {
		dir = MuxDir(os.Getenv)
	}
	_, err := h.useMux(dir)
	return err
}

// maxSocketPath is the longest unix socket path the platforms we build for
// take (macOS and the BSDs: 104 bytes with the NUL); a master binds a
// temporary name 17 bytes longer than its ControlPath first.
const maxSocketPath = 103 - 17

// useMux makes h's calls sessions on agent-wrap's own masters in dir, when
// the rsh is OpenSSH's and the user set no ControlPath (and no
// ControlMaster) of their own. It reports whether it did; an unusable dir
// is an error.
func (h *Host) useMux(dir string) (bool, error) {
	if !IsSSH(h.rsh) || setsControl(h.rsh, h.dest) || setsJump(h.rsh) {
		return false, nil
	}
	// The masters' sockets let anyone who can reach them run commands as
	// the user on the destination: their directory is private.
	if err := privsock.Dir(dir); err != nil {
		return false, fmt.Errorf("%w: the ControlMaster socket directory: %w", ErrMux, err)
	}
	base := filepath.Join(dir, hashWords(append(append([]string{}, h.rsh...), "\x00", h.dest)))
	if len(base)+3 > maxSocketPath {
		return false, fmt.Errorf("%w: the ControlMaster socket directory %s is too long for a socket path (at most %d bytes)", ErrMux, dir, maxSocketPath-20)
	}
	muxesMu.Lock()
	m := muxes[base]
	if m == nil {
		m = &mux{base: base, guard: true, ssh: h.rsh[0], full: map[int]time.Time{}}
		muxes[base] = m
	}
	muxesMu.Unlock()
	if err := m.acquire(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrMux, err)
	}
	h.mux = m
	h.batch = newRenewBatch(dir, h)
	return true, nil
}

// hashWords names a set of words in a file name: 16 base32 characters of
// their SHA-256.
func hashWords(words []string) string {
	sum := sha256.Sum256([]byte(strings.Join(words, "\x00")))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:10]))
}

// setsControl reports whether the user's ssh setup names a ControlPath or
// ControlMaster of its own: then the multiplexing is theirs.
func setsControl(rsh []string, dest string) bool {
	for _, w := range rsh[1:] {
		lw := strings.ToLower(w)
		if strings.Contains(lw, "controlpath") || strings.Contains(lw, "controlmaster") || socketFlag().MatchString(w) || w == "-M" {
			return true
		}
	}
	switch configMentions(rsh, "controlpath") {
	case mentioned:
		return true
	case notMentioned:
		return false
	}
	opts, err := sshG(rsh, dest)
	if err != nil {
		return true // cannot tell: leave ssh as the user has it
	}
	_, set := opts["controlpath"]
	return set
}

// setsJump reports whether the rsh words name a jump host: ssh refuses -J
// together with the ProxyCommand the clients carry.
func setsJump(rsh []string) bool {
	for _, w := range rsh[1:] {
		if strings.HasPrefix(w, "-J") || strings.Contains(strings.ToLower(w), "proxyjump") {
			return true
		}
	}
	return false
}

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

// start starts the master of slot: `ssh -M -N -o ControlPersist=...`, which
// returns once it is up and leaves it in the background. Its -E log is
// base.N.log, replaced at each start; its PID goes to base.N.pid.
func (m *mux) start(ctx context.Context, h *Host, slot int) Result {
	logPath := m.sock(slot) + ".log"
	os.Remove(logPath)
	os.Remove(m.sock(slot) + ".pid")
	os.Remove(m.sock(slot) + ".full") // a new master has room
	m.removeSlotFiles(slot)
	args := append(logLevelOpts(h.rsh), "-o", "ControlMaster=yes", "-o", "ControlPath="+m.sock(slot), "-o", "ControlPersist="+muxPersist)
	args = append(args, h.rsh[1:]...)
	args = append(args, h.keepalive...)
	args = append(args, "-E", logPath, "-N", "--", h.dest)
	cmd := exec.Command(h.rsh[0], args...)
	// Until it forks into the background, as a client: its own group, and
	// it dies with the controller (orphan.go). Its stderr is a file: an
	// error on its command line is said there, before it opens its log
	// (and a pipe would be held open by the master in the background).
	errf, err := os.CreateTemp(h.tmpdir, "master-stderr-")
	if err != nil {
		return Result{Code: 255, Err: err}
	}
	defer func() { errf.Close(); os.Remove(errf.Name()) }()
	cmd.Stderr = errf
	cmd.SysProcAttr = clientAttr()
	if err := cmd.Start(); err != nil {
		return Result{Code: 255, Err: err}
	}
	err = waitClient(ctx, cmd) // ctx ending kills its group (clientgroup.go)
	res := Result{}
	var ee *exec.ExitError
	switch {
	case err == nil:
		if !sockAlive(m.sock(slot)) {
			res.Code, res.SSHLog = 255, "the ssh ControlMaster exited at once"
		}
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
		if res.Code != -1 {
			res.Code = 255 // the master runs no remote command: any failure is ssh's
		}
	default:
		res.Code, res.Err = 255, err
	}
	b, lerr := os.ReadFile(logPath)
	res.NoLog = lerr != nil
	if res.Code != 0 || res.Err != nil {
		res.FullLog = string(b)
		if e, _ := os.ReadFile(errf.Name()); len(e) > 0 {
			res.Early = string(e)
			res.NoLog = false
			if !strings.HasSuffix(res.FullLog, "\n") && res.FullLog != "" {
				res.FullLog += "\n"
			}
			res.FullLog += string(e)
		}
		if s := sshReason(res.FullLog); s != "" {
			res.SSHLog = s
		}
		return res
	}
	m.recordPID(slot)
	return res
}

// recordPID writes base.N.pid: "PID START", the master's PID as it
// reports it (masterPID) and its start time, so that it can be told apart
// from a later process of the same PID.
func (m *mux) recordPID(slot int) {
	pid, err := masterPID(m.sock(slot), 5*time.Second)
	if err != nil || pid <= 0 {
		return
	}
	st, err := proc.ReadStat(pid)
	if err != nil {
		return
	}
	_ = os.WriteFile(m.sock(slot)+".pid", []byte(fmt.Sprintf("%d %d\n", pid, st.Start)), 0o600)
}

// acquire counts one more host of this process on the masters, taking the
// destination's users lock (shared) for the first.
func (m *mux) acquire() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refs == 0 {
		f, err := os.OpenFile(m.base+".users", os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		// Blocking: an exclusive holder only stops the masters, briefly.
		if err := flock.Lock(int(f.Fd()), syscall.LOCK_SH); err != nil {
			f.Close()
			return &os.PathError{Op: "flock", Path: f.Name(), Err: err}
		}
		m.users = f
	}
	m.refs++
	return nil
}

// release counts one host fewer; after the last, the masters are stopped
// when no other controller process uses them (see the file comment).
func (m *mux) release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refs--; m.refs > 0 {
		return
	}
	f := m.users
	m.users = nil
	defer f.Close()
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return // another controller uses them: its to stop
	}
	m.stopAll()
	m.full = map[int]time.Time{}
}

// stopAll ends every master of the destination: `ssh -O exit` on its
// socket, then SIGKILL to its recorded PID if it lingers (checked against
// its start time). Called with the users lock held exclusively.
func (m *mux) stopAll() {
	for i := 0; i < maxMasters; i++ {
		p := m.sock(i)
		if sockAlive(p) {
			_ = exec.Command(m.ssh, "-F", "/dev/null", "-o", "ControlPath="+p, "-O", "exit", "agent-wrap-mux").Run()
		}
		if pid, start, ok := readPIDFile(p + ".pid"); ok {
			killLingering(pid, start, 2*time.Second)
		}
		os.Remove(p)
		os.Remove(p + ".pid")
		os.Remove(p + ".log")
		os.Remove(p + ".full")
		os.Remove(p + ".starting")
		m.removeSlotFiles(i)
	}
}

// readPIDFile reads "PID START" from path.
func readPIDFile(path string) (pid int, start uint64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	// A file without a start time names no one process: proc.Alive would
	// take any process at the PID for it, and a lingering master is killed
	// on that answer.
	return pid, start, err1 == nil && err2 == nil && pid > 0 && start > 0
}

// killLingeringByLooking is killLingering where no pidfd can hold the
// process: it looks every 10 ms, and checks its start time again just
// before the signal (the window between the two is left).
func killLingeringByLooking(pid int, start uint64, within time.Duration) {
	deadline := time.Now().Add(within)
	for proc.Alive(pid, start) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if proc.Alive(pid, start) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// sockAlive reports whether a master listens on the socket at path: false
// only when nothing does (the socket is gone, or refuses: its master
// died). A master too busy to accept at once (its backlog full: EAGAIN, a
// timeout) is alive: its socket must never be taken for a dead one's.
func sockAlive(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return true
	}
	return !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist)
}

// lockFile takes an flock (how: LOCK_EX or LOCK_SH) on path (created 0600),
// waiting until ctx ends. unlock releases it.
func lockFile(ctx context.Context, path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	// Polled (a blocking flock cannot end with ctx), up to every 50 ms: a
	// burst of callers waiting must not burn the machine's CPU.
	if err := flock.Poll(ctx, int(f.Fd()), how, 50*time.Millisecond); err != nil {
		f.Close()
		if err == ctx.Err() {
			return nil, err
		}
		return nil, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	return func() { f.Close() }, nil
}

// RecordedMaster is a ControlMaster as a controller recorded it in the mux
// directory: its socket path and the PID and start time in SOCKET.pid.
type RecordedMaster struct {
	Socket string
	PID    int
	Start  uint64
}

// RecordedMasters lists the masters recorded in dir that are alive and
// still the process recorded (start time checked): what a test or a
// benchmark watches, read with the controller's own reader of the file.
func RecordedMasters(dir string) []RecordedMaster {
	names, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	var out []RecordedMaster
	for _, n := range names {
		if pid, start, ok := readPIDFile(n); ok && proc.Alive(pid, start) {
			out = append(out, RecordedMaster{Socket: strings.TrimSuffix(n, ".pid"), PID: pid, Start: start})
		}
	}
	return out
}
