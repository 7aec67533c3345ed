package wrapper

// This file: Run and the order of a run (see the package doc). The steps
// live beside it: launch_linux.go (start the job), loop_linux.go (wait for
// the leader, a signal or the deadline; record the intent with
// stop.Intend), reap_linux.go (the reaper: every waitid and wait4, and
// the leader's exit decoded once), targets_linux.go (the run's processes,
// as membership judges them for their wrapper), stopping_linux.go (TERM,
// grace, KILL: stop.Loop woken by SIGCHLD) and record_linux.go
// (status.json and the journal).

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

type supervisor struct {
	cfg  Config
	d    *rundir.Dir
	rec  statusfile.Record
	diag io.Writer
	sigs chan os.Signal

	self        int
	reap        reaper // every wait on our children, and the leader's exit
	leaderStart uint64

	escaped map[int]statusfile.Escaped // by PID; validated by start time
	tracker *membership.Tracker        // the wait's looks without a cgroup; nil until the first
	cgroup  string                     // the run's cgroup directory, if it has one
	cg      *cgroup.Group              // created before the first record, until the fork

	journalMu sync.Mutex
	jw        *journal.Writer // the run's journal, kept open; nil until the first event

	// view is a copy of the record for contains, which other goroutines
	// call: set when the job has started and at each recorded escape.
	view atomic.Pointer[statusfile.Record]

	scope *scope     // the run's authority (authority_linux.go)
	ctl   *control   // the run's control socket and handoffs (handoff_linux.go)
	stdin *stdinFeed // the job's stdin, when the wrapper feeds it (stdin_linux.go)
	http  *httpScope // the run's HTTP gateways (http_linux.go)
}

// Run supervises one run from the claim of its ID to its final record. The
// error is non-nil only when the ID could not be claimed (rundir.ErrExists
// among others): nothing was started then. Every run that was claimed ends
// with a Result whose record is terminal on disk, as far as the disk allows.
//
// Run changes the whole process, not just the goroutine that calls it, and
// none of it is undone on return:
//   - it makes the process a child subreaper (PR_SET_CHILD_SUBREAPER), so
//     every orphan of the job is reparented to it, and it reaps every child
//     of the process, by PID (any other child the caller started is reaped
//     too and its exit status lost);
//   - it subscribes to SIGTERM, SIGINT, SIGHUP, SIGCHLD and SIGPIPE with
//     signal.Notify for as long as it runs, so none of them has its default
//     effect meanwhile (signal.Stop on return restores it, unless
//     Config.Exiting);
//   - it sets the garbage collector's percent to 50 (debug.SetGCPercent);
//   - it marks every inherited file descriptor from 3 up close-on-exec
//     before it starts the job, so no later exec in the process inherits
//     them either.
//
// Call it once per process: a second Run would share the subreaper's
// children and the signals with the first.
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
	if !cfg.Exiting {
		defer signal.Stop(s.sigs)
	}

	// 2. The claim.
	d, err := cfg.Root.Create(cfg.ID)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	s.d = d
	deadline, err := s.claim()
	if err != nil {
		// All or nothing: no job was started, and the run directory goes,
		// so the ID is free again.
		s.closeJournal()
		if s.cg != nil {
			s.cg.Close()
			cgroup.Remove(s.cg.Path)
		}
		if rerr := cfg.Root.RemoveAll(cfg.ID); rerr != nil {
			s.warn("cannot remove the run directory of a run that never started: %v", rerr)
		}
		return nil, err
	}
	res := s.run(deadline)
	s.closeJournal()
	return res, nil
}

// ErrClaim is returned (wrapped, with the cause) by Run when the run's first
// record could not be written and synced, or its journal space reserved (a
// full disk at the claim): the job was not started, and the run directory
// was removed, so the ID is free again.
var ErrClaim = errors.New("cannot record the run")

// claim writes what must be on disk before the job may start: the
// journal, with the space a stop's lines need reserved (journal.Reserve),
// the deadline, and the `starting` record, synced. It returns the deadline
// (0: no lease).
func (s *supervisor) claim() (int64, error) {
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
		Boundary:     membership.BoundarySubreaper,
	}
	if cfg.Cgroup != CgroupOff {
		// The job will start inside its own cgroup (clone3
		// CLONE_INTO_CGROUP): there is no moment at which it or a child is
		// outside it. The first record already names it, so a wrapper
		// that dies before it records the job's PID leaves the job
		// findable by cancel and the watchdog, and the run is recorded
		// once before the fork, not twice (one fsync less on the way to
		// the job's start).
		if cg, err := cgroup.Create(membership.CgroupName(cfg.ID, s.self)); err == nil {
			s.cg = cg
			s.rec.Boundary, s.rec.Cgroup = membership.BoundaryCgroup, cg.Path
		}
	}
	// The lease runs from the claim: the deadline is written with the
	// first record, not after the fork as a record of its own.
	var deadline int64
	if cfg.Lease > 0 {
		deadline = lease.DeadlineAfter(time.Now(), cfg.Lease)
	}
	reserved, err := s.reserveJournal()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrClaim, err)
	}
	if err := s.writeFirstRecords(deadline); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrClaim, err)
	}
	created := journal.Fields{"wrapper_pid": s.self, "wrapper_start": wstart, "boot_id": boot, "reserved": reserved,
		"lease_seconds": cfg.Lease.Seconds(), "grace_seconds": cfg.Grace.Seconds(), "boundary": s.rec.Boundary}
	if s.rec.Cgroup != "" {
		created["cgroup"] = s.rec.Cgroup
	}
	if err := s.appendJournal("created", created, false); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrClaim, err)
	}
	return deadline, nil
}

func (s *supervisor) run(deadline int64) *Result {
	cfg := s.cfg

	// 3. Start the job, with its authority scoped to the run.
	if err := s.startAuthority(); err != nil {
		s.markLive()
		return s.launchFailed(exitLaunchFailed, fmt.Errorf("cannot scope the SSH agent to the run: %v (--agent inherit or none runs without a relay)", err))
	}
	if err := s.startHTTP(); err != nil {
		s.revokeAuthority()
		return s.launchFailed(exitLaunchFailed, fmt.Errorf("cannot start the HTTP gateways: %v", err))
	}
	s.startControl()
	code, err := s.launch()
	if err != nil {
		s.revokeAuthority()
		s.closeControl()
		return s.launchFailed(code, err)
	}

	// 5. The run is live: pid, pgid, running.
	leader := s.reap.leader
	pidLine := []byte(strconv.Itoa(leader) + "\n")
	if err := s.d.WriteOnce(rundir.PIDFile, pidLine); err != nil {
		s.warn("cannot write pid: %v", err)
	}
	if err := s.d.WriteOnce(rundir.PGIDFile, pidLine); err != nil {
		s.warn("cannot write pgid: %v", err)
	}
	s.rec.State = statusfile.Running
	s.rec.PID, s.rec.PGID, s.rec.SID = leader, leader, leader
	s.rec.LeaderStart = s.leaderStart
	s.rec.StartedAt = statusfile.Timestamp(time.Now())
	started := journal.Fields{"pid": leader, "pgid": leader, "sid": leader,
		"leader_start": s.leaderStart, "deadline_epoch": deadline, "boundary": s.rec.Boundary}
	if s.cgroup != "" {
		started["cgroup"] = s.cgroup
	}
	s.journal("started", started, false)
	s.writeRecord(false) // not terminal: see statusfile.Write
	s.publish()
	s.markLive()
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
	// The run is ending: its authority ends first, before any signal.
	s.revokeAuthority()

	// 7. Stop everything that is left.
	var stopped stop.Result
	if cause != "" {
		stopped = s.stopAll(cause)
	} else if targets := s.liveTargets(); len(targets) > 0 {
		stopped = s.stopAll("")
	}

	// 8. Reap, prove, record, drain. The leader's exit, if it is first
	// seen now (it died at the end of the stop), is journaled like any
	// other; then the reaper reaps it and every other zombie child, and
	// settle kills what is still below the wrapper until it has no child
	// left: the proof that the final record may say nothing survived.
	survivors, proven := stopped.Survivors, false
	if len(survivors) == 0 {
		survivors, proven = s.settle()
	} else {
		s.pollLeader()
		s.reap.reapAll()
	}
	containment := statusfile.ContainmentSession
	switch {
	case proven && s.cgroup != "":
		containment = statusfile.ContainmentCgroup
	case proven:
		containment = statusfile.ContainmentSubreaper
	}
	s.closeControl() // every handoff's last word goes into the final record
	if s.cgroup != "" {
		if err := cgroup.Remove(s.cgroup); err != nil {
			s.warn("cannot remove the run's cgroup: %v", err)
		}
	}
	res := s.finish(cause, containment, survivors)
	if streams != nil {
		streams.finish()
	}
	return res
}
