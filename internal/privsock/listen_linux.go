package privsock

import (
	"math"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// listen binds and listens on a unix socket at path: socket, bind and
// listen on the descriptor itself, which then goes to the runtime's poller
// once (net.FileListener). net.ListenUnix would first read
// /proc/sys/net/core/somaxconn for the backlog, through the poller (a /proc
// file it then reports ready, waking the poller's thread), at the start of
// every wrapper: the kernel caps the backlog at that value anyway, so the
// largest backlog asked for here is the same one. On a failure after the
// bind, the socket is removed.
func listen(path string) (*net.UnixListener, error) {
	fail := func(op string, err error) error {
		return &net.OpError{Op: "listen", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: os.NewSyscallError(op, err)}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fail("socket", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // the listener has its own descriptor
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, fail("bind", err)
	}
	if err := unix.Listen(fd, math.MaxInt32); err != nil {
		_ = unix.Unlink(path)
		return nil, fail("listen", err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		_ = unix.Unlink(path)
		return nil, err
	}
	return ln.(*net.UnixListener), nil
}
