package httpgw

import (
	"os"

	"golang.org/x/sys/unix"
)

// NoDump makes the process non-dumpable (PR_SET_DUMPABLE 0), before it
// reads a secret: no core file, and a process of the same user can neither
// ptrace it nor read its /proc/PID/mem or environ (those files become
// root's). A program it execs is dumpable again, as usual.
func NoDump() error {
	return os.NewSyscallError("prctl(PR_SET_DUMPABLE)", unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0))
}
