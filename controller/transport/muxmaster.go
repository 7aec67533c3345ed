package transport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/flock"
	"github.com/agent-wrap/agent-wrap/proc"
)

// A master's lifecycle (mux.go): started in a claimed slot, its PID
// recorded, shared by the controller processes of the user that use the
// destination, and stopped by the last of them.

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
	_ = flock.Lock(int(f.Fd()), syscall.LOCK_UN)
	if flock.Lock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
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
