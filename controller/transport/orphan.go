package transport

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// A controller killed with KILL must leave no ssh client behind to launch
// or act later, behind the back of a settle. On Linux and FreeBSD the
// kernel sees to it: each client is started with a parent-death signal
// (SysProcAttr.Pdeathsig: prctl PR_SET_PDEATHSIG, procctl
// PROC_PDEATHSIG_CTL). macOS has no such thing, so there the controller
// keeps a guard (orphan_darwin.go): one /bin/sh per controller process,
// started with the first client, that reads the process groups of the live
// clients from a pipe only the controller holds the writing end of. When
// the controller dies, however it dies, the kernel closes that end; the
// guard reads end of file and SIGKILLs every group still registered.

// guardScript keeps a space-separated set of process groups: "+G" adds G,
// "-G" removes it; at end of input it kills what is left.
const guardScript = `gs=' '
while IFS= read -r l; do
	case $l in
	+*) gs="$gs${l#+} " ;;
	-*) g=${l#-}; case $gs in *" $g "*) gs="${gs%% $g *} ${gs#* $g }" ;; esac ;;
	esac
done
for g in $gs; do kill -s KILL -- "-$g" 2>/dev/null; done`

// guard is one orphan guard. Its methods are safe for concurrent use.
type guard struct {
	mu  sync.Mutex
	w   *os.File // the pipe's writing end; nil until started
	pid int      // the guard's shell
	sh  string   // the shell; "" is /bin/sh
}

// start starts the guard's shell, in a process group of its own (a
// terminal's ^C is not for it), if it is not running.
func (g *guard) start() error {
	if g.w != nil {
		return nil
	}
	r, w, err := os.Pipe() // both ends close-on-exec: no other child holds w
	if err != nil {
		return err
	}
	sh := g.sh
	if sh == "" {
		sh = "/bin/sh"
	}
	cmd := exec.Command(sh, "-c", guardScript)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return fmt.Errorf("start the orphan guard: %w", err)
	}
	g.w, g.pid = w, cmd.Process.Pid
	// Reap it if it ever ends (it ends when w is closed, or if killed).
	go cmd.Wait()
	return nil
}

// add registers the process group pgid, starting the guard if need be.
// A guard that died is started again, once.
func (g *guard) add(pgid int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for try := 0; ; try++ {
		if err := g.start(); err != nil {
			return err
		}
		_, err := fmt.Fprintf(g.w, "+%d\n", pgid)
		if err == nil || try == 1 {
			return err
		}
		g.w.Close()
		g.w = nil
	}
}

// remove unregisters pgid: its leader has been waited for.
func (g *guard) remove(pgid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w != nil {
		fmt.Fprintf(g.w, "-%d\n", pgid)
	}
}
