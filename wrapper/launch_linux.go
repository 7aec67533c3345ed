package wrapper

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Launch failure exit codes, as a shell would return them (exitcode's table).
const (
	exitNotFound      = exitcode.NotFound
	exitNotExecutable = exitcode.NotExecutable
	exitLaunchFailed  = exitcode.Software
)

// launch starts the job in a new session and verifies that it has one.
func (s *supervisor) launch() (int, error) {
	if s.cg != nil {
		defer s.cg.Close() // the fork has it, or there is no job
	}
	argv := s.cfg.Argv
	path, err := exec.LookPath(argv[0])
	if err != nil && !errors.Is(err, exec.ErrDot) {
		switch {
		case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
			return exitNotFound, fmt.Errorf("command not found: %s", argv[0])
		case errors.Is(err, fs.ErrPermission):
			return exitNotExecutable, fmt.Errorf("command not executable: %s", argv[0])
		}
		return exitNotExecutable, fmt.Errorf("cannot execute %s: %v", argv[0], err)
	}
	stdin := s.cfg.Stdin
	if s.cfg.StdinPipe {
		r, err := s.newStdinPipe()
		if err != nil {
			return exitLaunchFailed, err
		}
		defer r.Close() // the job has it
		stdin = r
	} else if stdin == nil {
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return exitLaunchFailed, err
		}
		defer devnull.Close()
		stdin = devnull
	}
	out, err := s.d.OpenFile(rundir.StdoutFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return exitLaunchFailed, fmt.Errorf("open stdout.log: %w", err)
	}
	defer out.Close()
	errf, err := s.d.OpenFile(rundir.StderrFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return exitLaunchFailed, fmt.Errorf("open stderr.log: %w", err)
	}
	defer errf.Close()

	// The job gets exactly fds 0, 1 and 2: whatever the wrapper inherited
	// without close-on-exec (from sshd, a shell, a CI runner) stops here.
	closeOnExecFrom(3)

	// Setsid alone: with Setpgid as well, setpgid after setsid fails.
	attr := &syscall.ProcAttr{
		Env:   s.jobEnv(),
		Files: []uintptr{stdin.Fd(), out.Fd(), errf.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	cg := s.cg
	if cg != nil {
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, cg.FD()
	}
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil && cg != nil && cloneIntoCgroupUnsupported(err) {
		cgroup.Remove(cg.Path)
		cg, s.cg = nil, nil
		s.rec.Boundary, s.rec.Cgroup = membership.BoundarySubreaper, ""
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = false, 0
		pid, err = syscall.ForkExec(path, argv, attr)
	}
	if err != nil && cg != nil {
		cgroup.Remove(cg.Path)
	}
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			switch errno {
			case unix.ENOENT:
				return exitNotFound, fmt.Errorf("command not found: %s: %v", path, err)
			case unix.EACCES, unix.ENOEXEC, unix.EISDIR, unix.EPERM:
				return exitNotExecutable, fmt.Errorf("command not executable: %s: %v", path, err)
			}
		}
		return exitLaunchFailed, fmt.Errorf("start %s: %v", path, err)
	}
	// 4. Verify the session. The job is our unreaped child, so /proc/PID/stat
	// exists even if it has already exited: the check never races the job.
	st, err := proc.ReadStat(pid)
	if err == nil && (st.PGID != pid || st.SID != pid) {
		err = fmt.Errorf("job %d is in process group %d and session %d, not its own: setsid did not take effect", pid, st.PGID, st.SID)
	}
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		s.reap.discard(pid)
		if cg != nil {
			cgroup.Remove(cg.Path)
		}
		return exitLaunchFailed, err
	}
	s.reap.leader, s.leaderStart = pid, st.Start
	if cg != nil {
		s.cgroup = cg.Path
		s.rec.Boundary, s.rec.Cgroup = membership.BoundaryCgroup, cg.Path
	}
	return 0, nil
}

// cloneIntoCgroupUnsupported reports whether ForkExec failed because the
// kernel cannot start a process into a cgroup (clone3 missing before Linux
// 5.3, CLONE_INTO_CGROUP before 5.7), as opposed to an exec failure.
func cloneIntoCgroupUnsupported(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case unix.ENOSYS, unix.EINVAL, unix.E2BIG, unix.EOPNOTSUPP, unix.EBUSY:
		return true
	}
	return false
}

func (s *supervisor) launchFailed(code int, err error) *Result {
	s.warn("%v", err)
	if s.cg != nil && s.cgroup == "" {
		// No job ever ran in it (or it was killed there): remove it, and
		// the record no longer names it.
		if err := cgroup.Remove(s.cg.Path); err != nil {
			s.warn("cannot remove the run's cgroup: %v", err)
		}
		s.rec.Boundary, s.rec.Cgroup = membership.BoundarySubreaper, ""
	}
	s.rec.State = statusfile.LaunchFailed
	s.rec.Error = err.Error()
	s.rec.SetExit(code)
	s.rec.EndedAt = statusfile.Timestamp(time.Now())
	s.rec.Survivors = []int{}
	s.journal("launch_failed", journal.Fields{"exit_code": code, "error": err.Error()}, false)
	if s.writeRecord(true) {
		s.journal("final", journal.Fields{"state": s.rec.State, "exit_code": code}, true)
	}
	r := s.rec
	return &Result{Record: &r, Code: code}
}

// closeOnExecFrom marks every descriptor from lowfd up close-on-exec:
// close_range(CLOSE_RANGE_CLOEXEC) on Linux 5.11 and later, else one fcntl
// per descriptor listed in /proc/self/fd.
func closeOnExecFrom(lowfd int) {
	if err := unix.CloseRange(uint(lowfd), math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < lowfd {
			continue
		}
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	}
}
