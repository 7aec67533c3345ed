package stop_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// startingRun fabricates what a wrapper SIGKILLed while starting its job
// leaves behind: a `starting` record naming no group, and a pid file.
func startingRun(t *testing.T, pid int) *rundir.Dir {
	t.Helper()
	d := runtest.RunDir(t, "adopt-1")
	boot, _ := proc.BootID()
	self, err := proc.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	rec := &statusfile.Record{RunID: d.ID, State: statusfile.Starting, WrapperPID: 0, WrapperStart: self.Start,
		BootID: boot, Command: []string{"sleep", "600"}, CreatedAt: statusfile.Timestamp(time.Now()), LeaseSeconds: 1, GraceSeconds: 1}
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
	if _, err := journal.Append(d, "created", nil, true); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteOnce(rundir.PIDFile, []byte(strconv.Itoa(pid)+"\n")); err != nil {
		t.Fatal(err)
	}
	return d
}

// edit rewrites d's record through change, as a wrapper killed at another
// moment would have left it.
func edit(t *testing.T, d *rundir.Dir, change func(*statusfile.Record)) {
	t.Helper()
	rec, err := statusfile.Read(d)
	if err != nil {
		t.Fatal(err)
	}
	change(rec)
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
}

// inCgroup makes d's record name cgroup g, as a wrapper records it before
// the fork.
func inCgroup(t *testing.T, d *rundir.Dir, g string) {
	t.Helper()
	edit(t, d, func(rec *statusfile.Record) { rec.Boundary, rec.Cgroup = membership.BoundaryCgroup, g })
}

// replace removes d's file name and, unless data is nil, writes it anew
// with data (empty, for a file created and not yet written).
func replace(t *testing.T, d *rundir.Dir, name string, data []byte) {
	t.Helper()
	if err := d.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if data == nil {
		return
	}
	if err := d.WriteOnce(name, data); err != nil {
		t.Fatal(err)
	}
}

func startSleep(t *testing.T, setsid bool) proc.Stat {
	t.Helper()
	return runtest.Spawn(t, &unix.SysProcAttr{Setsid: setsid, Setpgid: !setsid}, "sleep", "600")
}

// A wrapper killed between starting the job and recording it `running`:
// an outside stop takes the job's identity from the pid file, once it has
// checked that the process there is a session leader younger than the
// wrapper, and stops it, instead of recording `cancelled` over a live job.
func TestOutsideAdoptsStartingJob(t *testing.T) {
	job := startSleep(t, true)
	d := startingRun(t, job.PID)
	rep, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseLease, Intent: "deadline_expired", By: "watchdog"})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the adopted job to die", func() bool { return !proc.Alive(job.PID, 0) })
	if rep.Record.State != statusfile.Cancelled || rep.Record.PGID != job.PID || len(rep.Record.Survivors) != 0 {
		t.Fatalf("record after the stop: %+v", rep.Record)
	}
	if len(rep.Signalled) == 0 {
		t.Fatal("nothing was signalled")
	}
}

// A pid file naming a process that is not a session leader (a recycled
// PID) is not adopted: nothing is signalled.
func TestOutsideRefusesToAdoptAStranger(t *testing.T) {
	other := startSleep(t, false) // own group, but the test's session
	d := startingRun(t, other.PID)
	rep, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseLease, Intent: "deadline_expired", By: "watchdog"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Signalled) != 0 || !proc.Alive(other.PID, 0) {
		t.Fatalf("a process that is not the run's was signalled: %v", rep.Signalled)
	}
}

// A wrapper that died after opening the job's logs but before writing its
// PID leaves a run that may or may not have a job: an outside stop refuses
// to record it stopped, and leaves the record as it was.
func TestOutsideRefusesUnknowableStart(t *testing.T) {
	d := startingRun(t, 0)
	replace(t, d, rundir.PIDFile, nil)
	replace(t, d, rundir.StdoutFile, []byte{})
	_, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseLease, Intent: "deadline_expired", By: "watchdog"})
	if !errors.Is(err, stop.ErrRefused) {
		t.Fatalf("Outside on a run whose job may exist unseen: %v, want ErrRefused", err)
	}
	if rec, err := statusfile.Read(d); err != nil || rec.State != statusfile.Starting {
		t.Fatalf("record after the refusal: %+v, %v", rec, err)
	}
}

// A wrapper killed between creating the pid file and writing it leaves it
// empty. The record names the run's cgroup, and in it are the job's leader
// and, started after it, a descendant that called setsid (also a session
// leader): the stop adopts the first as the job, not the escapee, and
// stops both.
func TestOutsideAdoptsFromCgroupWithEmptyPidFile(t *testing.T) {
	g := runtest.Cgroup(t, membership.CgroupName("adopt-1", os.Getpid()))
	leader := runtest.SpawnIn(t, g, "sleep", "600")
	escapee := runtest.SpawnIn(t, g, "sleep", "600")
	d := startingRun(t, 0)
	replace(t, d, rundir.PIDFile, []byte{})
	inCgroup(t, d, g.Path)
	rep, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseLease, Intent: "deadline_expired", By: "watchdog"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Record.PGID != leader.PID {
		t.Fatalf("adopted group %d, want the leader %d (the escapee is %d)", rep.Record.PGID, leader.PID, escapee.PID)
	}
	runtest.Eventually(t, "the leader and the escapee to die", func() bool {
		return !proc.Alive(leader.PID, 0) && !proc.Alive(escapee.PID, 0)
	})
	if rep.Record.State != statusfile.Cancelled || len(rep.Record.Survivors) != 0 {
		t.Fatalf("record after the stop: %+v", rep.Record)
	}
}

// cancelWhileStarting turns d's `starting` record into what a cancel
// recorded while the wrapper was starting the job leaves: `cancelling`,
// cause cancel, still naming no process group.
func cancelWhileStarting(t *testing.T, d *rundir.Dir) {
	t.Helper()
	edit(t, d, func(rec *statusfile.Record) { rec.State, rec.Cause = statusfile.Cancelling, statusfile.CauseCancel })
}

// A cancel recorded while the wrapper was starting the job, and the
// wrapper then killed before it recorded the job: the record is
// `cancelling` and names no group. The stop that finishes the cancel
// adopts the job (from the pid file, or from the run's cgroup when the pid
// file is empty) and stops it, instead of recording `cancelled` with no
// survivors over a live job; reconcile, asked before, sees the job.
func TestOutsideAdoptsJobCancelledWhileStarting(t *testing.T) {
	for _, from := range []string{"pid file", "cgroup"} {
		t.Run(from, func(t *testing.T) {
			var job proc.Stat
			var d *rundir.Dir
			if from == "pid file" {
				job = startSleep(t, true)
				d = startingRun(t, job.PID)
			} else {
				g := runtest.Cgroup(t, membership.CgroupName("adopt-1", os.Getpid()))
				job = runtest.SpawnIn(t, g, "sleep", "600")
				d = startingRun(t, 0)
				replace(t, d, rundir.PIDFile, nil)
				inCgroup(t, d, g.Path)
			}
			cancelWhileStarting(t, d)
			assertJudgedRunning(t, d, job.PID)
			rep, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseCancel, Intent: "cancel_requested", By: "cancel"})
			if err != nil {
				t.Fatal(err)
			}
			runtest.Eventually(t, "the adopted job to die", func() bool { return !proc.Alive(job.PID, job.Start) })
			if rep.Record.State != statusfile.Cancelled || rep.Record.Cause != statusfile.CauseCancel || rep.Record.PGID != job.PID || len(rep.Signalled) == 0 {
				t.Fatalf("record after the stop: %+v, signalled %v", rep.Record, rep.Signalled)
			}
		})
	}
}

// Without a pid file, a cgroup or a live wrapper, the job is the session
// leader whose standard output is the run's stdout.log, the very file the
// wrapper opened for it: the stop adopts and stops it, and leaves alone a
// session leader that writes elsewhere, and one that writes to a file of
// the same name in another directory.
func TestOutsideAdoptsJobByItsLog(t *testing.T) {
	d := startingRun(t, 0)
	replace(t, d, rundir.PIDFile, nil)
	cancelWhileStarting(t, d)
	logged := func(path string) proc.Stat {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command("sleep", "600")
		cmd.Stdout = f
		cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
		return runtest.StartInGroup(t, cmd).Leader
	}
	job := logged(filepath.Join(d.Path, rundir.StdoutFile))
	namesake := logged(filepath.Join(t.TempDir(), rundir.StdoutFile))
	stranger := startSleep(t, true)
	assertJudgedRunning(t, d, job.PID)
	rep, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseCancel, Intent: "cancel_requested", By: "cancel"})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the job to die", func() bool { return !proc.Alive(job.PID, job.Start) })
	if rep.Record.PGID != job.PID {
		t.Fatalf("adopted group %d, want the job %d", rep.Record.PGID, job.PID)
	}
	for _, p := range []proc.Stat{namesake, stranger} {
		if !proc.Alive(p.PID, p.Start) {
			t.Errorf("pid %d, not the run's, did not survive the stop", p.PID)
		}
	}
	for _, pid := range rep.Signalled {
		if pid == namesake.PID || pid == stranger.PID {
			t.Errorf("pid %d, not the run's, was signalled", pid)
		}
	}
}

// assertJudgedRunning checks that reconcile, asked about the run whose
// record names no group, finds the job it would adopt and says running,
// not "no process of the run is alive".
func assertJudgedRunning(t *testing.T, d *rundir.Dir, job int) {
	t.Helper()
	in := reconcile.Gather(d)
	v := reconcile.Decide(in)
	if v.Outcome != reconcile.Running || len(in.Members) == 0 || in.Members[0].PID != job {
		t.Fatalf("reconcile before the stop: %s (%s), members %+v; want running with the job %d", v.Outcome, v.Reason, in.Members, job)
	}
}

// A wrapper that died after opening the job's logs, with no pid file and
// nothing writing to the logs: with the run's cgroup empty, that is the
// proof that no job runs, and the stop records `cancelled` (containment
// cgroup); the same run without a cgroup is refused (TestOutsideRefusesUnknowableStart).
func TestOutsideEmptyCgroupProvesNoJob(t *testing.T) {
	g := runtest.Cgroup(t, membership.CgroupName("adopt-1", os.Getpid()))
	d := startingRun(t, 0)
	replace(t, d, rundir.PIDFile, nil)
	replace(t, d, rundir.StdoutFile, []byte{})
	inCgroup(t, d, g.Path)
	cancelWhileStarting(t, d)
	rep, err := stop.Outside(d, stop.Options{Grace: time.Second, Cause: statusfile.CauseCancel, Intent: "cancel_requested", By: "cancel"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Record.State != statusfile.Cancelled || rep.Record.Containment != statusfile.ContainmentCgroup || len(rep.Signalled) != 0 {
		t.Fatalf("record after the stop of a run with an empty cgroup: %+v, signalled %v", rep.Record, rep.Signalled)
	}
}
