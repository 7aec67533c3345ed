package transport

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/flock"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The mux directory's files and locks (mux.go): PID files, the masters'
// sockets, and flocks that wait with a context.

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
