package transport

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/privsock"
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

// The files, by concern: mux.go, when to mux (SetMux) and what a
// destination's masters are; muxslot.go, a call's session and the choice
// of its master's slot; muxticket.go, a master's sessions counted across
// processes; muxmaster.go, a master's start and stop; muxfiles.go, the
// files and locks in the mux directory; muxproto.go, OpenSSH's mux
// protocol, to learn a master's PID.

// Mux modes of SetMux (the controller's Config.Mux).
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

// ErrMux is returned (wrapped) by SetMux, and so by the controller's
// Start, when the masters' socket directory cannot be used, or the mode is
// not one.
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
