//go:build linux || darwin || freebsd

// Package privsock makes the unix sockets only their owner may use: a
// private directory to hold them (Dir) and a socket bound with mode 0600
// (Listen), within the length a socket address holds (MaxPath).
//
// What it guarantees: Dir accepts only a real directory (not a symlink)
// owned by the effective user and closed to group and others; Listen
// replaces nothing but a stale socket at its path, and leaves no socket
// behind when it fails. What it does not: the socket's mode is set after
// the bind, so a socket in a directory others can enter is theirs to
// connect to for that moment; put it in a private directory.
package privsock

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Dir makes sure dir is a directory of ours that nobody else can enter,
// creating it (mode 0700) if needed. It refuses a symlink or anything but
// a directory, a directory another user owns, and one open to group or
// others, saying which.
func Dir(dir string) error {
	if err := unix.Mkdir(dir, 0o700); err != nil && err != unix.EEXIST {
		return &os.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s is a symlink or not a directory", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s is owned by uid %d, not by you", dir, st.Uid)
	case st.Mode&0o077 != 0:
		return fmt.Errorf("%s has mode %04o, open to group or others", dir, st.Mode&0o7777)
	}
	return nil
}

// Listen binds a unix socket at path with mode 0600. A socket left at path
// (by a process that died without removing it) is replaced; anything else
// there makes the bind fail. A path longer than MaxPath is refused before
// anything is done. The listener does not remove the socket when it is
// closed: the caller removes it, and can say so.
func Listen(path string) (*net.UnixListener, error) {
	if len(path) > MaxPath {
		return nil, fmt.Errorf("socket path %s is %d bytes, longer than a socket address holds (%d)", path, len(path), MaxPath)
	}
	removeStale(path)
	ln, err := listen(path)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		os.Remove(path)
		return nil, err
	}
	return ln, nil
}

// removeStale removes a socket at path, and never anything else.
func removeStale(path string) {
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		_ = unix.Unlink(path)
	}
}
