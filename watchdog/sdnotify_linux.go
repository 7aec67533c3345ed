package watchdog

import (
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The service unit is Type=notify with WatchdogSec=: the watchdog loop must
// send "READY=1" once it is up and "WATCHDOG=1" at least every
// WatchdogInterval, or systemd kills and restarts it. Notifier is the whole
// of the sd_notify(3) protocol it needs. Only the watchdog speaks it, so it
// lives here.

// Notifier is a client of a service manager's notification socket. The
// zero Notifier has no service manager to tell: it sends nothing and asks
// for no pings.
type Notifier struct {
	// Socket is $NOTIFY_SOCKET: a path, or "@name" for an abstract
	// socket; "" for none.
	Socket string
	// WatchdogInterval is how often to send "WATCHDOG=1": half the
	// service manager's WatchdogSec=, as sd_watchdog_enabled(3) advises.
	// It is 0 when no pings are expected from this process.
	WatchdogInterval time.Duration
}

// EnvNotifier is the Notifier the service manager described in this
// process's environment: $NOTIFY_SOCKET, and $WATCHDOG_USEC unless
// $WATCHDOG_PID names another process.
func EnvNotifier() Notifier {
	n := Notifier{Socket: os.Getenv("NOTIFY_SOCKET")}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return n
	}
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return n
	}
	n.WatchdogInterval = time.Duration(usec) * time.Microsecond / 2
	return n
}

// Notify sends state (e.g. "READY=1", "WATCHDOG=1", "STOPPING=1") to the
// service manager. It reports false with a nil error when there is no
// service manager to tell (not started by systemd, or not a notify
// service), so callers may call it unconditionally.
func (n Notifier) Notify(state string) (sent bool, err error) {
	name := n.Socket
	if name == "" {
		return false, nil
	}
	if name[0] == '@' { // an abstract socket
		name = "\x00" + name[1:]
	}
	// A raw datagram socket rather than package net, which would add about
	// a MiB to a binary that every wrapper maps.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, []byte(state), 0, &unix.SockaddrUnix{Name: name}); err != nil {
		return false, os.NewSyscallError("sendto", err)
	}
	return true, nil
}
