package stop_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// startingRun fabricates what a wrapper SIGKILLed while starting its job
// leaves behind: a `starting` record naming no group, and a pid file.
func startingRun(t *testing.T, pid int) *rundir.Dir {
	t.Helper()
	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	d, err := root.Create("adopt-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
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
	if err := d.Remove(rundir.PIDFile); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteOnce(rundir.StdoutFile, nil); err != nil {
		t.Fatal(err)
	}
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
	if err := d.Remove(rundir.PIDFile); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteOnce(rundir.PIDFile, nil); err != nil {
		t.Fatal(err)
	}
	rec, err := statusfile.Read(d)
	if err != nil {
		t.Fatal(err)
	}
	rec.Boundary, rec.Cgroup = membership.BoundaryCgroup, g.Path
	if err := statusfile.Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
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
