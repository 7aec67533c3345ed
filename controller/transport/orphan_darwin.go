package transport

import (
	"fmt"
	"os"
	"syscall"
)

// clientAttr: its own process group; macOS has no parent-death signal, so
// guardClient registers the group with the orphan guard (orphan.go).
func clientAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// orphans is the controller process's one guard.
var orphans guard

// guardClient registers the client's group with the guard until release.
// The client is already running: if the controller dies between its start
// and this registration (a few microseconds), it is not killed with it.
func guardClient(pgid int) (release func()) {
	if err := orphans.add(pgid); err != nil {
		fmt.Fprintf(os.Stderr, "agent-wrap: cannot guard ssh client %d against the controller's death: %v\n", pgid, err)
		return func() {}
	}
	return func() { orphans.remove(pgid) }
}
