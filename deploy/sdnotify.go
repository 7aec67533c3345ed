package deploy

import (
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The service unit is Type=notify with WatchdogSec=: the watchdog loop must
// send "READY=1" once it is up and "WATCHDOG=1" at least every
// WatchdogInterval, or systemd kills and restarts it. These two functions
// are the whole of the sd_notify(3) protocol it needs.

// Notify sends state (e.g. "READY=1", "WATCHDOG=1", "STOPPING=1") to the
// service manager named by $NOTIFY_SOCKET. It reports false with a nil error
// when there is no service manager to tell (not started by systemd, or not a
// notify service), so callers may call it unconditionally.
func Notify(state string) (sent bool, err error) {
	name := os.Getenv("NOTIFY_SOCKET")
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

// WatchdogInterval is how often to send "WATCHDOG=1": half the service
// manager's WatchdogSec= (from $WATCHDOG_USEC), as sd_watchdog_enabled(3)
// advises. It is 0 when no pings are expected from this process.
func WatchdogInterval() time.Duration {
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
