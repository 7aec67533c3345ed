package wrapper

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Launch failure exit codes, as a shell would return them.
const (
	ExitNotFound      = 127
	ExitNotExecutable = 126
	ExitLaunchFailed  = 70
)

// How long to keep KILLing what is left before giving up and recording
// survivors. KILL cannot be caught; only a process stuck in the kernel
// (state D on a dead NFS mount, say) outlives it.
const killWait = 10 * time.Second

type supervisor struct {
	cfg  Config
	d    *rundir.Dir
	rec  statusfile.Record
	diag io.Writer
	sigs chan os.Signal

	self        int
	leader      int // job leader PID == PGID == SID
	leaderStart uint64

	leaderExited bool
	leaderCode   int
	leaderSig    unix.Signal

	escaped map[int]statusfile.Escaped // by PID; validated by start time
	cgroup  string                     // the run's cgroup directory, if it has one
	cg      *cgroup.Group              // created before the first record, until the fork

	journalMu sync.Mutex
}

// Run supervises one run from the claim of its ID to its final record. The
// error is non-nil only when the ID could not be claimed (rundir.ErrExists
// among others): nothing was started then. Every run that was claimed ends
// with a Result whose record is terminal on disk, as far as the disk allows.
func Run(cfg Config) (*Result, error) {
	if cfg.Diag == nil {
		cfg.Diag = io.Discard
	}
	if cfg.OnHangup == "" {
		cfg.OnHangup = HangupCancel
	}
	// 1. Subreaper and signals before the job exists.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, os.NewSyscallError("prctl(PR_SET_CHILD_SUBREAPER)", err)
	}
	// A wrapper lives as long as its job, one per job on a host: keep its
	// heap small. Half the default GOGC halves the 4 MiB minimum heap
	// target; the live heap is a few hundred KiB, and an idle wrapper
	// allocates next to nothing, so this costs no idle CPU. (A memory limit
	// below the runtime's own footprint did: it made idle wrappers collect
	// 8 times a second.)
	debug.SetGCPercent(50)
	s := &supervisor{cfg: cfg, diag: cfg.Diag, self: os.Getpid(), escaped: map[int]statusfile.Escaped{}}
	s.sigs = make(chan os.Signal, 32)
	signal.Notify(s.sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGCHLD, unix.SIGPIPE)
	defer signal.Stop(s.sigs)

	// 2. The claim.
	d, err := cfg.Root.Create(cfg.ID)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	s.d = d
	return s.run(), nil
}

func (s *supervisor) run() *Result {
	cfg := s.cfg
	boot, err := proc.BootID()
	if err != nil {
		s.warn("cannot read boot_id: %v", err)
	}
	var wstart uint64
	if st, err := proc.ReadStat(s.self); err == nil {
		wstart = st.Start
	}
	s.rec = statusfile.Record{
		RunID:        cfg.ID,
		State:        statusfile.Starting,
		WrapperPID:   s.self,
		WrapperStart: wstart,
		BootID:       boot,
		Command:      cfg.Argv,
		CreatedAt:    statusfile.Timestamp(time.Now()),
		LeaseSeconds: cfg.Lease.Seconds(),
		GraceSeconds: cfg.Grace.Seconds(),
		OnHangup:     cfg.OnHangup,
		Boundary:     BoundarySubreaper,
	}
	if cfg.Cgroup != CgroupOff {
		// The job will start inside its own cgroup (clone3
		// CLONE_INTO_CGROUP): there is no moment at which it or a child is
		// outside it. The first record already names it, so a wrapper
		// that dies before it records the job's PID leaves the job
		// findable by cancel and the watchdog, and the run is recorded
		// once before the fork, not twice (one fsync less on the way to
		// the job's start).
		if cg, err := cgroup.Create(fmt.Sprintf("%s.%d", cfg.ID, s.self)); err == nil {
			s.cg = cg
			s.rec.Boundary, s.rec.Cgroup = BoundaryCgroup, cg.Path
		}
	}
	s.writeRecord(false)
	s.journal("created", journal.Fields{"wrapper_pid": s.self, "wrapper_start": wstart,
		"lease_seconds": cfg.Lease.Seconds(), "grace_seconds": cfg.Grace.Seconds(), "boundary": s.rec.Boundary}, false)

	// 3. Start the job.
	code, err := s.launch()
	if err != nil {
		return s.launchFailed(code, err)
	}

	// 5. The run is live: pid, pgid, deadline, running.
	pidLine := []byte(strconv.Itoa(s.leader) + "\n")
	if err := s.d.WriteOnce(rundir.PIDFile, pidLine); err != nil {
		s.warn("cannot write pid: %v", err)
	}
	if err := s.d.WriteOnce(rundir.PGIDFile, pidLine); err != nil {
		s.warn("cannot write pgid: %v", err)
	}
	var deadline int64
	if cfg.Lease > 0 {
		deadline = lease.DeadlineAfter(time.Now(), cfg.Lease)
		if err := lease.WriteDeadline(s.d, deadline); err != nil {
			s.warn("cannot write deadline_epoch: %v (the wrapper still enforces the lease)", err)
		}
	}
	s.rec.State = statusfile.Running
	s.rec.PID, s.rec.PGID, s.rec.SID = s.leader, s.leader, s.leader
	s.rec.LeaderStart = s.leaderStart
	s.rec.StartedAt = statusfile.Timestamp(time.Now())
	started := journal.Fields{"pid": s.leader, "pgid": s.leader, "sid": s.leader,
		"leader_start": s.leaderStart, "deadline_epoch": deadline, "boundary": s.rec.Boundary}
	if s.cgroup != "" {
		started["cgroup"] = s.cgroup
	}
	s.journal("started", started, false)
	s.writeRecord(false) // not terminal: see statusfile.Write
	if cfg.Running != nil {
		r := s.rec
		cfg.Running(&r)
	}

	var streams *streamer
	if cfg.Stream {
		streams = s.startStreams()
	}

	// 6. Wait for the leader, a signal or the deadline.
	cause := s.wait(deadline)

	// 7. Stop everything that is left.
	var survivors []int
	if cause != "" {
		survivors = s.stopAll(cause)
	} else if targets := s.liveTargets(); len(targets) > 0 {
		survivors = s.stopAll("")
	}

	// 8. Reap, record, drain.
	s.reapAll()
	if s.cgroup != "" {
		if err := cgroup.Remove(s.cgroup); err != nil {
			s.warn("cannot remove the run's cgroup: %v", err)
		}
	}
	res := s.finish(cause, survivors)
	if streams != nil {
		streams.finish()
	}
	return res
}

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
			return ExitNotFound, fmt.Errorf("command not found: %s", argv[0])
		case errors.Is(err, fs.ErrPermission):
			return ExitNotExecutable, fmt.Errorf("command not executable: %s", argv[0])
		}
		return ExitNotExecutable, fmt.Errorf("cannot execute %s: %v", argv[0], err)
	}
	stdin := s.cfg.Stdin
	if stdin == nil {
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return ExitLaunchFailed, err
		}
		defer devnull.Close()
		stdin = devnull
	}
	out, err := s.d.OpenFile(rundir.StdoutFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return ExitLaunchFailed, fmt.Errorf("open stdout.log: %w", err)
	}
	defer out.Close()
	errf, err := s.d.OpenFile(rundir.StderrFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return ExitLaunchFailed, fmt.Errorf("open stderr.log: %w", err)
	}
	defer errf.Close()

	// The job gets exactly fds 0, 1 and 2: whatever the wrapper inherited
	// without close-on-exec (from sshd, a shell, a CI runner) stops here.
	closeOnExecFrom(3)

	// Setsid alone: with Setpgid as well, setpgid after setsid fails.
	attr := &syscall.ProcAttr{
		Env:   os.Environ(),
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
		s.rec.Boundary, s.rec.Cgroup = BoundarySubreaper, ""
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
				return ExitNotFound, fmt.Errorf("command not found: %s: %v", path, err)
			case unix.EACCES, unix.ENOEXEC, unix.EISDIR, unix.EPERM:
				return ExitNotExecutable, fmt.Errorf("command not executable: %s: %v", path, err)
			}
		}
		return ExitLaunchFailed, fmt.Errorf("start %s: %v", path, err)
	}
	// 4. Verify the session. The job is our unreaped child, so /proc/PID/stat
	// exists even if it has already exited: the check never races the job.
	st, err := proc.ReadStat(pid)
	if err == nil && (st.PGID != pid || st.SID != pid) {
		err = fmt.Errorf("job %d is in process group %d and session %d, not its own: setsid did not take effect", pid, st.PGID, st.SID)
	}
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, 0, nil)
		if cg != nil {
			cgroup.Remove(cg.Path)
		}
		return ExitLaunchFailed, err
	}
	s.leader, s.leaderStart = pid, st.Start
	if cg != nil {
		s.cgroup = cg.Path
		s.rec.Boundary, s.rec.Cgroup = BoundaryCgroup, cg.Path
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
		s.rec.Boundary, s.rec.Cgroup = BoundarySubreaper, ""
	}
	s.rec.State = statusfile.LaunchFailed
	s.rec.Error = err.Error()
	s.rec.SetExit(code)
	s.rec.EndedAt = statusfile.Timestamp(time.Now())
	s.rec.Survivors = []int{}
	s.journal("launch_failed", journal.Fields{"exit_code": code, "error": err.Error()}, false)
	s.writeRecord(true)
	s.journal("final", journal.Fields{"state": s.rec.State, "exit_code": code}, true)
	r := s.rec
	return &Result{Record: &r, Code: code}
}

// wait blocks until the leader exits (returns "") or the run must be
// cancelled (returns the cause).
func (s *supervisor) wait(deadline int64) string {
	var leaseC <-chan time.Time
	var timer *time.Timer
	if deadline > 0 {
		timer = time.NewTimer(time.Until(time.Unix(deadline, 0)))
		defer timer.Stop()
		leaseC = timer.C
	}
	// A backstop scan finds escaped descendants within about a second and
	// reaps orphans even if a SIGCHLD was coalesced with another.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()

	if s.pollLeader() {
		return s.cancelledMeanwhile()
	}
	for {
		select {
		case sig := <-s.sigs:
			switch sig {
			case unix.SIGCHLD:
				if s.pollLeader() {
					return s.cancelledMeanwhile()
				}
				s.reapOthers()
			case unix.SIGPIPE:
				// A closed stream: the streamer has seen the error already.
			case unix.SIGHUP:
				if s.cfg.OnHangup == HangupIgnore {
					s.journal("hangup_ignored", nil, false)
					continue
				}
				return s.beginCancel(statusfile.CauseHUP, "cancel_requested")
			case unix.SIGTERM:
				return s.beginCancel(statusfile.CauseTERM, "cancel_requested")
			case unix.SIGINT:
				return s.beginCancel(statusfile.CauseINT, "cancel_requested")
			}
		case <-leaseC:
			next, expired := s.checkLease()
			if expired != "" {
				return expired
			}
			timer.Reset(time.Until(time.Unix(next, 0)))
		case <-tick.C:
			s.scanFast() // records escapes; per run with a cgroup, all of /proc without
			if s.pollLeader() {
				return s.cancelledMeanwhile()
			}
		}
	}
}

// cancelledMeanwhile is called when the leader has exited: if a cancel was
// recorded before that (by the cancel command, which then TERMs us), the run
// still ends as cancelled, since that is what was asked and recorded.
func (s *supervisor) cancelledMeanwhile() string {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v", err)
		return ""
	}
	defer unlock()
	if disk, err := statusfile.Read(s.d); err == nil && disk.State == statusfile.Cancelling {
		s.rec.State, s.rec.Cause = disk.State, disk.Cause
		return disk.Cause
	}
	return ""
}

// beginCancel records the intent (journal, synced) and `cancelling`
// (durable) under the run's lock, before any signal is sent. If the run is
// already cancelling, the cause recorded first wins and is returned.
func (s *supervisor) beginCancel(cause, event string) string {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (stopping anyway)", err)
	} else {
		defer unlock()
		if disk, err := statusfile.Read(s.d); err == nil && disk.State == statusfile.Cancelling && disk.Cause != "" {
			s.rec.State, s.rec.Cause = disk.State, disk.Cause
			return disk.Cause
		}
	}
	s.journal(event, journal.Fields{"cause": cause, "by": "wrapper", "pid": s.self}, true)
	s.rec.State, s.rec.Cause = statusfile.Cancelling, cause
	s.writeRecordLocked(false)
	return cause
}

// checkLease runs when the deadline timer fires. Under the run's lock it
// rereads deadline_epoch: a renewal moved it (returns the new deadline), or
// it has passed, and the expiry is journaled and synced and `cancelling`
// written before anything is signalled (returns cause lease).
func (s *supervisor) checkLease() (int64, string) {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (enforcing the lease anyway)", err)
		return 0, s.expire(0)
	}
	defer unlock()
	disk, err := statusfile.Read(s.d)
	if err == nil && disk.State == statusfile.Cancelling && disk.Cause != "" {
		s.rec.State, s.rec.Cause = disk.State, disk.Cause
		return 0, disk.Cause
	}
	dl, err := lease.ReadDeadline(s.d)
	if err != nil {
		s.warn("cannot read deadline_epoch: %v (treating the lease as expired)", err)
		return 0, s.expire(0)
	}
	if time.Now().Before(time.Unix(dl, 0)) {
		return dl, ""
	}
	return 0, s.expire(dl)
}

// expire records the lease expiry; the caller holds the lock.
func (s *supervisor) expire(deadline int64) string {
	s.journal("deadline_expired", journal.Fields{"deadline_epoch": deadline, "by": "wrapper", "pid": s.self}, true)
	s.rec.State, s.rec.Cause = statusfile.Cancelling, statusfile.CauseLease
	s.writeRecordLocked(false)
	return statusfile.CauseLease
}

// pollLeader checks, without reaping, whether the leader has exited.
func (s *supervisor) pollLeader() bool {
	if s.leaderExited {
		return true
	}
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, s.leader, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			s.warn("waitid(%d): %v", s.leader, err)
			return false
		}
		break
	}
	pid, status := childInfo(&info)
	if pid != s.leader {
		return false
	}
	s.leaderExited = true
	f := journal.Fields{"pid": s.leader}
	switch info.Code {
	case _CLD_EXITED:
		s.leaderCode = status
		f["exit_code"] = status
	default: // killed or dumped
		s.leaderSig = unix.Signal(status)
		s.leaderCode = 128 + status
		f["signal"] = proc.SignalName(s.leaderSig)
	}
	s.journal("leader_exited", f, false)
	return true
}

const (
	_CLD_EXITED = 1
)

// childInfo reads si_pid and si_status from a SIGCHLD siginfo, which
// x/sys/unix keeps opaque: after si_signo, si_errno and si_code (three
// int32s), the union is pointer-aligned; its sigchld member starts with
// pid_t si_pid, uid_t si_uid, int si_status.
func childInfo(si *unix.Siginfo) (pid, status int) {
	off := uintptr(12)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	base := unsafe.Pointer(si)
	pid = int(*(*int32)(unsafe.Add(base, off)))
	status = int(*(*int32)(unsafe.Add(base, off+8)))
	return pid, status
}

// reapOthers reaps exited children other than the leader (orphans of the
// job, reparented to us as their subreaper) without reading /proc:
// waitid(WNOWAIT) names a zombie child; unless it is the leader, wait4 reaps
// it. The leader is left for reapAll, after its group has been stopped.
func (s *supervisor) reapOthers() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return // ECHILD: no children
		}
		pid, _ := childInfo(&info)
		if pid <= 0 || pid == s.leader {
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil && err != unix.EINTR {
			return
		}
	}
}

// target is a process the stop must end: a member of the job's group, or a
// descendant that escaped it.
type target struct {
	proc.Stat
	escaped bool
}

// scan reads the process table once: it reaps zombie children other than
// the leader, records new escapes (when record is set) and returns the live
// targets.
func (s *supervisor) scan(record bool) []target {
	all, err := proc.Scan()
	if err != nil {
		s.warn("cannot read /proc: %v", err)
		return nil
	}
	children := map[int][]int{}
	byPID := make(map[int]proc.Stat, len(all))
	for _, p := range all {
		byPID[p.PID] = p
		children[p.PPID] = append(children[p.PPID], p.PID)
	}
	// Descendants: as subreaper, every orphan of the job is reparented to
	// us, so the tree below us is the job's whole tree.
	desc := map[int]bool{}
	queue := []int{s.self}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !desc[c] {
				desc[c] = true
				queue = append(queue, c)
			}
		}
	}
	inCgroup := map[int]bool{}
	if s.cgroup != "" {
		pids, _ := cgroup.Procs(s.cgroup)
		for _, p := range pids {
			inCgroup[p] = true
		}
	}
	var out []target
	for _, p := range all {
		if p.PPID == s.self && p.Dead() && p.PID != s.leader {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p.PID, &ws, unix.WNOHANG, nil)
			continue
		}
		if p.Dead() || p.PID == s.self {
			continue
		}
		inGroup := p.PGID == s.leader && p.SID == s.leader && p.Start >= s.leaderStart
		if inGroup {
			out = append(out, target{Stat: p})
			continue
		}
		if desc[p.PID] {
			if record {
				s.noteEscape(p)
			}
			out = append(out, target{Stat: p, escaped: true})
			continue
		}
		// Escaped earlier and since reparented away from us (cannot happen
		// while we are its subreaper, but the record is the authority), or
		// in the run's cgroup, which nothing leaves by forking.
		if e, ok := s.escaped[p.PID]; ok && e.Start == p.Start {
			out = append(out, target{Stat: p, escaped: true})
		} else if inCgroup[p.PID] {
			out = append(out, target{Stat: p, escaped: true})
		}
	}
	return out
}

// noteEscape journals and records a descendant outside the job's group.
func (s *supervisor) noteEscape(p proc.Stat) {
	if e, ok := s.escaped[p.PID]; ok && e.Start == p.Start {
		return
	}
	argv, _ := proc.Cmdline(p.PID)
	e := statusfile.Escaped{PID: p.PID, PGID: p.PGID, SID: p.SID, Start: p.Start, Argv: argv}
	s.escaped[p.PID] = e
	s.journal("escaped", journal.Fields{"pid": p.PID, "pgid": p.PGID, "sid": p.SID, "start": p.Start, "argv": argv}, true)
	s.rec.Escaped = append(s.rec.Escaped, e)
	s.writeRecord(false) // the synced journal line is the durable fact
}

func (s *supervisor) liveTargets() []target { return s.scanFast() }

// scanFast lists the targets from the run's cgroup when it has one: one
// read of cgroup.procs and one stat per member, instead of every process on
// the host. Escapes recorded earlier are checked by PID. Without a cgroup it
// is scan.
func (s *supervisor) scanFast() []target {
	if s.cgroup == "" {
		return s.scan(true)
	}
	pids, err := cgroup.Procs(s.cgroup)
	if err != nil {
		return s.scan(true)
	}
	seen := map[int]bool{}
	var out []target
	for _, pid := range pids {
		if pid == s.self {
			continue
		}
		p, err := proc.ReadStat(pid)
		if err != nil || p.Dead() {
			continue
		}
		seen[pid] = true
		if p.PGID == s.leader && p.SID == s.leader && p.Start >= s.leaderStart {
			out = append(out, target{Stat: p})
			continue
		}
		s.noteEscape(p)
		out = append(out, target{Stat: p, escaped: true})
	}
	for pid, e := range s.escaped {
		if seen[pid] {
			continue
		}
		if p, err := proc.ReadStat(pid); err == nil && !p.Dead() && p.Start == e.Start {
			out = append(out, target{Stat: p, escaped: true})
		}
	}
	return out
}

// stopAll stops the group and every escaped descendant: TERM, wait for them
// to die until the grace passes, then KILL until nothing is left. It returns
// the PIDs that outlived KILL. cause "" means the leader exited on its own
// and these are stragglers.
func (s *supervisor) stopAll(cause string) []int {
	targets := s.liveTargets()
	var stopped []int
	if len(targets) > 0 {
		stopped = pids(targets)
		s.signalAll(unix.SIGTERM, targets)
		targets = s.waitGone(time.Now().Add(s.cfg.Grace), targets)
	}
	until := time.Now().Add(killWait)
	for len(targets) > 0 && time.Now().Before(until) {
		s.signalAll(unix.SIGKILL, targets)
		// KILL is not negotiable: wait a short while, then KILL again
		// whatever appeared (a job forking while it is being stopped).
		targets = s.waitGone(time.Now().Add(500*time.Millisecond), targets)
	}
	survivors := pids(targets)
	if cause == "" && len(stopped) > 0 {
		s.journal("stragglers_stopped", journal.Fields{"pids": stopped, "survivors": survivors}, false)
	}
	if len(survivors) > 0 {
		s.warn("%d processes outlived KILL: %v", len(survivors), survivors)
	}
	return survivors
}

func pids(ts []target) []int {
	out := make([]int, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.PID)
	}
	sort.Ints(out)
	return out
}

// signalAll journals the signal, then sends it to the group with killpg
// (safe: the leader is our unreaped child, so its PGID cannot have been
// recycled) and to each escaped descendant through a validated pidfd.
func (s *supervisor) signalAll(sig unix.Signal, ts []target) {
	var group, esc []int
	for _, t := range ts {
		if t.escaped {
			esc = append(esc, t.PID)
		} else {
			group = append(group, t.PID)
		}
	}
	f := journal.Fields{"signal": proc.SignalName(sig), "pgid": s.leader, "pids": group}
	target := "group"
	if len(esc) > 0 {
		f["escaped"] = esc
		target = "group+escaped"
		if len(group) == 0 {
			target = "escaped"
		}
	}
	useCgroupKill := sig == unix.SIGKILL && s.cgroup != ""
	if useCgroupKill {
		target += "+cgroup"
		f["cgroup"] = s.cgroup
	}
	f["target"] = target
	s.journal("signal_sent", f, false)
	if useCgroupKill {
		if err := cgroup.Kill(s.cgroup); err != nil {
			s.warn("cgroup.kill %s: %v (signalling each process instead)", s.cgroup, err)
		}
	}
	if len(group) > 0 {
		if err := unix.Kill(-s.leader, sig); err != nil && err != unix.ESRCH {
			s.warn("kill(-%d, %s): %v", s.leader, proc.SignalName(sig), err)
		}
	}
	for _, t := range ts {
		if !t.escaped {
			continue
		}
		err := proc.Signal(proc.Identity{PID: t.PID, Start: t.Start}, sig)
		if err != nil && !errors.Is(err, proc.ErrGone) {
			s.warn("signal %s to escaped %d: %v", proc.SignalName(sig), t.PID, err)
		}
	}
}

// waitGone waits until no target is alive or until the deadline, woken by
// SIGCHLD (as subreaper we hear of every death in the tree, at the latest
// when the zombie is reparented to us) with a backstop rescan. Signals to the
// wrapper while it is stopping change nothing: the stop is already under way.
func (s *supervisor) waitGone(until time.Time, ts []target) []target {
	backoff := 5 * time.Millisecond
	for {
		if !s.leaderExited {
			s.pollLeader()
		}
		if len(ts) == 0 {
			return nil
		}
		left := time.Until(until)
		if left <= 0 {
			return ts
		}
		wait := backoff
		if wait > left {
			wait = left
		}
		t := time.NewTimer(wait)
		select {
		case <-s.sigs:
		case <-t.C:
			if backoff < 100*time.Millisecond {
				backoff *= 2
			}
		}
		t.Stop()
		ts = s.recheck(ts)
		if len(ts) == 0 {
			ts = s.scanFast()
		}
	}
}

// recheck keeps the targets that are still alive, reading only their own
// /proc/PID/stat.
func (s *supervisor) recheck(ts []target) []target {
	var out []target
	for _, t := range ts {
		st, err := proc.ReadStat(t.PID)
		if err != nil || st.Start != t.Start || st.Dead() {
			continue
		}
		out = append(out, t)
	}
	return out
}

// reapAll reaps the leader, now that its group has been stopped, and every
// other zombie child.
func (s *supervisor) reapAll() {
	if s.leaderExited {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(s.leader, &ws, 0, nil)
			if err != unix.EINTR {
				break
			}
		}
	} else {
		s.pollLeader()
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if pid == s.leader && !s.leaderExited {
			// Reaped here after KILL: take its status.
			s.leaderExited = true
			if ws.Signaled() {
				s.leaderSig = ws.Signal()
				s.leaderCode = 128 + int(ws.Signal())
			} else {
				s.leaderCode = ws.ExitStatus()
			}
		}
	}
}

// finish writes the final record: `finished` with the leader's code, or
// `cancelled` with the cause's code. A record already made terminal by
// someone else (the watchdog or cancel, after deciding we had stopped
// acting) is never overwritten.
func (s *supervisor) finish(cause string, survivors []int) *Result {
	if survivors == nil {
		survivors = []int{}
	}
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v (writing the final record anyway)", err)
	} else {
		defer unlock()
		if disk, err := statusfile.Read(s.d); err == nil {
			if statusfile.Terminal(disk.State) {
				return &Result{Record: disk, Code: disk.Code()}
			}
			if disk.State == statusfile.Cancelling && cause == "" {
				cause = disk.Cause
			}
		}
	}
	r := &s.rec
	r.EndedAt = statusfile.Timestamp(time.Now())
	r.Survivors = survivors
	if s.leaderSig != 0 {
		r.Signal = proc.SignalName(s.leaderSig)
	}
	if cause != "" {
		r.State, r.Cause = statusfile.Cancelled, cause
		r.SetExit(statusfile.CauseExitCode(cause))
	} else {
		r.State = statusfile.Finished
		r.SetExit(s.leaderCode)
	}
	s.writeRecordLocked(true)
	f := journal.Fields{"state": r.State, "exit_code": r.Code(), "survivors": survivors}
	if r.Cause != "" {
		f["cause"] = r.Cause
	}
	if r.Signal != "" {
		f["signal"] = r.Signal
	}
	s.journal("final", f, false)
	out := *r
	return &Result{Record: &out, Code: r.Code()}
}

// writeRecord replaces status.json under the run's lock.
func (s *supervisor) writeRecord(durable bool) {
	unlock, err := s.d.Lock()
	if err != nil {
		s.warn("cannot lock the run: %v", err)
		s.writeRecordLocked(durable)
		return
	}
	defer unlock()
	s.writeRecordLocked(durable)
}

// writeRecordLocked replaces status.json; the caller holds the lock. A
// cancel recorded by another process (state cancelling) is kept, and a
// terminal record is never replaced.
func (s *supervisor) writeRecordLocked(durable bool) {
	if disk, err := statusfile.Read(s.d); err == nil {
		if statusfile.Terminal(disk.State) {
			return
		}
		if disk.State == statusfile.Cancelling && s.rec.State == statusfile.Running {
			s.rec.State, s.rec.Cause = disk.State, disk.Cause
		}
	}
	if err := statusfile.Write(s.d, &s.rec, durable); err != nil {
		s.warn("cannot write status.json (state %s): %v", s.rec.State, err)
	}
}

func (s *supervisor) journal(event string, f journal.Fields, sync bool) {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if _, err := journal.Append(s.d, event, f, sync); err != nil {
		s.warn("cannot journal %s: %v", event, err)
	}
}

func (s *supervisor) warn(format string, a ...any) {
	fmt.Fprintf(s.diag, "agent-wrap: run %s: "+format+"\n", append([]any{s.cfg.ID}, a...)...)
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
