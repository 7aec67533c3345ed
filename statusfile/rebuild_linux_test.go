package statusfile_test

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
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func appendLine(t *testing.T, d *rundir.Dir, event string, f journal.Fields) {
	t.Helper()
	if _, err := journal.Append(d, event, f, false); err != nil {
		t.Fatal(err)
	}
}

// An unreadable status.json is rebuilt from the journal and the pid files:
// the wrapper, the job's identity, the lease and grace, the intent; a
// record that is missing while the journal has no created line is a run
// being created (the read's error), and pid files that disagree with the
// journal are not believed.
func TestReadOrRebuild(t *testing.T) {
	boot, err := proc.BootID()
	if err != nil {
		t.Fatal(err)
	}
	d := runtest.RunDir(t, "rb")
	if _, err := statusfile.ReadOrRebuild(d); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a run being created: %v, want not-exist", err)
	}
	appendLine(t, d, "created", journal.Fields{"wrapper_pid": 4321, "wrapper_start": 77, "boot_id": boot, "lease_seconds": 60.0, "grace_seconds": 2.0, "boundary": "subreaper"})
	appendLine(t, d, "started", journal.Fields{"pid": 5000, "pgid": 5000, "sid": 5000, "leader_start": 99, "deadline_epoch": 1234})
	os.WriteFile(filepath.Join(d.Path, "pid"), []byte("5000\n"), 0o600)
	os.WriteFile(filepath.Join(d.Path, "pgid"), []byte("5000\n"), 0o600)
	for _, garbage := range []string{"", "{\"schema\":1,\"run", "null"} {
		os.WriteFile(filepath.Join(d.Path, "status.json"), []byte(garbage), 0o600)
		if _, err := statusfile.Read(d); err == nil {
			t.Fatalf("Read accepted %q", garbage)
		}
		r, err := statusfile.ReadOrRebuild(d)
		if err != nil {
			t.Fatalf("ReadOrRebuild over %q: %v", garbage, err)
		}
		if !r.Rebuilt || r.State != statusfile.Running || r.PID != 5000 || r.PGID != 5000 || r.SID != 5000 || r.LeaderStart != 99 ||
			r.WrapperPID != 4321 || r.WrapperStart != 77 || r.BootID != boot || r.LeaseSeconds != 60 || r.GraceSeconds != 2 || r.RunID != "rb" {
			t.Fatalf("rebuilt: %+v", r)
		}
	}
	appendLine(t, d, "deadline_expired", journal.Fields{"cause": "lease", "by": "watchdog"})
	r, err := statusfile.ReadOrRebuild(d)
	if err != nil || r.State != statusfile.Cancelling || r.Cause != statusfile.CauseLease {
		t.Fatalf("after the intent: %+v, %v", r, err)
	}
	// What is rebuilt can be written and read back as a record.
	if err := statusfile.Write(d, r, false); err != nil {
		t.Fatal(err)
	}
	if back, err := statusfile.Read(d); err != nil || !back.Rebuilt || back.JournalSeq != 3 {
		t.Fatalf("written back: %+v, %v", back, err)
	}
	os.WriteFile(filepath.Join(d.Path, "status.json"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(d.Path, "pid"), []byte("6000\n"), 0o600)
	if _, err := statusfile.ReadOrRebuild(d); !errors.Is(err, statusfile.ErrUnreadable) {
		t.Fatalf("pid file disagreeing with the journal: %v, want ErrUnreadable", err)
	}
}

// A record rebuilt from a final line appended late (by the first process
// that found the run over, after a stuck holder let go of the journal)
// ends when the final record said, its ended_at, not when the line was
// written.
func TestRebuildFromALateFinal(t *testing.T) {
	boot, err := proc.BootID()
	if err != nil {
		t.Fatal(err)
	}
	d := runtest.RunDir(t, "late")
	appendLine(t, d, "created", journal.Fields{"wrapper_pid": 4321, "wrapper_start": 77, "boot_id": boot, "lease_seconds": 60.0, "grace_seconds": 2.0, "boundary": "subreaper"})
	appendLine(t, d, "started", journal.Fields{"pid": 5000, "pgid": 5000, "sid": 5000, "leader_start": 99})
	const ended = "2026-01-02T03:04:05.678Z"
	appendLine(t, d, "final", journal.Fields{"state": "cancelled", "cause": "lease", "exit_code": 124, "survivors": []int{}, "late": true, "by": "renew", "ended_at": ended})
	os.WriteFile(filepath.Join(d.Path, "pid"), []byte("5000\n"), 0o600)
	os.WriteFile(filepath.Join(d.Path, "pgid"), []byte("5000\n"), 0o600)
	os.WriteFile(filepath.Join(d.Path, "status.json"), []byte("x"), 0o600)
	r, err := statusfile.ReadOrRebuild(d)
	if err != nil || r.State != statusfile.Cancelled || r.Code() != 124 || r.EndedAt != ended {
		t.Fatalf("rebuilt: %+v, %v; want cancelled, exit 124, ended_at %s", r, err, ended)
	}
}

// With the journal emptied too, the record is rebuilt from the pid files
// and the live leader: a session leader that started before the pid file
// was written is the run's job; one that started after it (a PID recycled
// since, here a pid file dated back an hour) is not, nor is a process that
// is no session leader (a member of a job's group), nor a leader that
// has exited (a zombie).
func TestRebuildFromPidFilesAlone(t *testing.T) {
	leader := runtest.Spawn(t, nil, "sleep", "300")
	d := runtest.RunDir(t, "pf")
	line := []byte(strconv.Itoa(leader.PID) + "\n")
	os.WriteFile(filepath.Join(d.Path, "pid"), line, 0o600)
	os.WriteFile(filepath.Join(d.Path, "pgid"), line, 0o600)
	os.WriteFile(filepath.Join(d.Path, "events.jsonl"), nil, 0o600)
	os.WriteFile(filepath.Join(d.Path, "status.json"), []byte("{\"sch"), 0o600)
	r, err := statusfile.ReadOrRebuild(d)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Rebuilt || r.State != statusfile.Running || r.PID != leader.PID || r.PGID != leader.PID || r.SID != leader.PID ||
		r.LeaderStart != leader.Start || r.BootID == "" || r.LeaseSeconds != 0 || r.GraceSeconds != 0 {
		t.Fatalf("rebuilt: %+v", r)
	}
	// A pid file written before its process started: a recycled PID.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(d.Path, "pid"), old, old)
	if _, err := statusfile.ReadOrRebuild(d); !errors.Is(err, statusfile.ErrUnreadable) {
		t.Fatalf("a pid file older than its process: %v, want ErrUnreadable", err)
	}
	// A PID that is no session leader: a member of a job's group.
	job := runtest.Spawn(t, nil, "sh", "-c", "sleep 300 & wait")
	member := 0
	runtest.Eventually(t, "the job's member", func() bool {
		for _, m := range runtest.Members(job.PID) {
			if m.PID != job.PID && m.Comm == "sleep" {
				member = m.PID
			}
		}
		return member != 0
	})
	other := []byte(strconv.Itoa(member) + "\n")
	os.WriteFile(filepath.Join(d.Path, "pid"), other, 0o600)
	os.WriteFile(filepath.Join(d.Path, "pgid"), other, 0o600)
	if _, err := statusfile.ReadOrRebuild(d); !errors.Is(err, statusfile.ErrUnreadable) {
		t.Fatalf("a pid file naming no session leader: %v, want ErrUnreadable", err)
	}
	// A leader that has exited and is not reaped yet (a zombie): the job
	// ended, and nothing says how; a stop may have ended the run.
	zc := exec.Command("true")
	zc.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	if err := zc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { zc.Wait() })
	runtest.Eventually(t, "the leader to be a zombie", func() bool {
		st, err := proc.ReadStat(zc.Process.Pid)
		return err == nil && st.Dead()
	})
	zombie := []byte(strconv.Itoa(zc.Process.Pid) + "\n")
	os.WriteFile(filepath.Join(d.Path, "pid"), zombie, 0o600)
	os.WriteFile(filepath.Join(d.Path, "pgid"), zombie, 0o600)
	if _, err := statusfile.ReadOrRebuild(d); !errors.Is(err, statusfile.ErrUnreadable) {
		t.Fatalf("a pid file naming a zombie leader: %v, want ErrUnreadable", err)
	}
}
