//go:build linux || freebsd

package transport

import "syscall"

// clientAttr is how an ssh client is started: in a process group of its
// own (a terminal's ^C is the controller's to handle), and killed by the
// kernel when the controller dies (see orphan.go). On Linux the signal
// comes when the thread that forked the client ends; Go never ends it, as
// nothing here locks an OS thread.
func clientAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// guardClient has nothing to do where the kernel kills the client.
func guardClient(pgid int) (release func()) { return func() {} }
