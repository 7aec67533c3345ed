//go:build darwin || freebsd

package privsock

import "net"

// listen binds and listens on a unix socket at path.
func listen(path string) (*net.UnixListener, error) {
	return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
}
