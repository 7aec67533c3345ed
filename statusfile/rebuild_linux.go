package statusfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/cgroup"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// ErrUnreadable is returned (wrapped, with the reason) by ReadOrRebuild
// when status.json cannot be read and the run's other files do not say
// enough to rebuild it.
var ErrUnreadable = errors.New("the run's record is unreadable and cannot be rebuilt")

// ReadOrRebuild reads the run's record like Read. When status.json is
// unreadable (empty, torn, garbage, hand-edited into nonsense) or missing
// while the journal says the run was created, it rebuilds the record from
// the evidence that survives: the journal (created: the wrapper, lease,
// grace and boot; started: the job's pid, pgid, sid and start time; escaped
// descendants; the intent; final) and the pid and pgid files, which must
// agree with it. The rebuilt record has Rebuilt set and is not written: the
// caller that acts on it writes it. The error is the read's, wrapped in
// ErrUnreadable, when there is not enough to rebuild from (no created line,
// no boot to check the PIDs against, pid files that disagree); a missing
// status.json that cannot be rebuilt is the read's error as it is (a run
// being created).
func ReadOrRebuild(d *rundir.Dir) (*Record, error) {
	rec, err := Read(d)
	if err == nil {
		return rec, nil
	}
	if errors.Is(err, rundir.ErrUnsafe) {
		return nil, err
	}
	rebuilt, rerr := rebuild(d)
	if rerr != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err // a run being created: its record comes next
		}
		return nil, fmt.Errorf("%w: %v; %v", ErrUnreadable, err, rerr)
	}
	return rebuilt, nil
}

var errNotCreated = errors.New("its journal has no created line")

func rebuild(d *rundir.Dir) (*Record, error) {
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		if r, perr := fromPidFiles(d); perr == nil {
			return r, nil
		}
		return nil, fmt.Errorf("no journal to rebuild it from: %w", err)
	}
	es := journal.Evidence(f, "created", "started", "adopted", "escaped", "deadline_expired", "cancel_requested", "launch_failed", "final")
	f.Close()
	r := &Record{Schema: Schema, RunID: d.ID, Rebuilt: true}
	created := false
	for _, e := range es {
		switch e.Event {
		case "created":
			created = true
			r.State = Starting
			r.CreatedAt = Timestamp(e.At)
			r.WrapperPID = intField(e, "wrapper_pid")
			r.WrapperStart = uint64(intField(e, "wrapper_start"))
			r.LeaseSeconds = floatField(e, "lease_seconds")
			r.GraceSeconds = floatField(e, "grace_seconds")
			r.Boundary = strField(e, "boundary")
			r.Cgroup = strField(e, "cgroup")
			r.BootID = strField(e, "boot_id")
			if r.BootID == "" && sameBoot(e) {
				// A journal of an older agent-wrap: the line's wall
				// clock less its CLOCK_BOOTTIME is when its boot began.
				r.BootID, _ = proc.BootID()
			}
		case "started", "adopted":
			if r.State == Starting {
				r.State = Running
			}
			r.PID, r.PGID, r.SID = intField(e, "pid"), intField(e, "pgid"), intField(e, "sid")
			r.LeaderStart = uint64(intField(e, "leader_start"))
			if cg := strField(e, "cgroup"); cg != "" {
				r.Cgroup = cg
			}
			if e.Event == "started" {
				r.StartedAt = Timestamp(e.At)
			}
		case "escaped":
			r.Escaped = append(r.Escaped, Escaped{PID: intField(e, "pid"), PGID: intField(e, "pgid"), SID: intField(e, "sid"), Start: uint64(intField(e, "start"))})
		case "deadline_expired", "cancel_requested":
			if !Terminal(r.State) && r.State != Cancelling {
				r.State, r.Cause = Cancelling, strField(e, "cause")
			}
		case "launch_failed":
			r.Error = strField(e, "error")
		case "final":
			st := strField(e, "state")
			if !validStates[st] || !Terminal(st) {
				continue
			}
			r.State = st
			if c := strField(e, "cause"); c != "" {
				r.Cause = c
			}
			r.Signal = strField(e, "signal")
			r.SetExit(intField(e, "exit_code"))
			r.EndedAt = Timestamp(e.At)
			if at := strField(e, "ended_at"); at != "" {
				r.EndedAt = at // a final line appended late carries the record's time
			}
			r.Survivors = []int{}
			if l, ok := e.Fields["survivors"].([]any); ok {
				for _, v := range l {
					if n, ok := v.(float64); ok {
						r.Survivors = append(r.Survivors, int(n))
					}
				}
			}
		}
	}
	if !created {
		r, perr := fromPidFiles(d)
		if perr != nil {
			return nil, fmt.Errorf("%w, and %v", errNotCreated, perr)
		}
		return r, nil
	}
	if r.BootID == "" {
		return nil, errors.New("its journal does not say which boot the run is of, so its PIDs mean nothing")
	}
	// The pid files are written once, after the PGID is verified: they
	// must agree with the journal, or fill in for a started line the
	// journal lost.
	for _, name := range []string{rundir.PIDFile, rundir.PGIDFile} {
		b, err := d.ReadFile(name)
		if err != nil {
			continue
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || v <= 1 {
			return nil, fmt.Errorf("%s holds %q, not a PID", name, b)
		}
		if r.PID == 0 {
			continue // adopted from the pid file by the stop, with its start time checked
		}
		if v != r.PID {
			return nil, fmt.Errorf("%s says %d, the journal's started line %d: they must agree", name, v, r.PID)
		}
	}
	if r.State == Running && r.LeaseSeconds > 0 && r.StartedAt == "" {
		r.StartedAt = r.CreatedAt
	}
	return r, nil
}

func intField(e journal.Entry, k string) int {
	if v, ok := e.Fields[k].(float64); ok {
		return int(v)
	}
	return 0
}

func floatField(e journal.Entry, k string) float64 {
	v, _ := e.Fields[k].(float64)
	return v
}

func strField(e journal.Entry, k string) string {
	v, _ := e.Fields[k].(string)
	return v
}

// sameBoot reports whether a journal line was written during this boot:
// its wall clock less its CLOCK_BOOTTIME is, within a minute (for clock
// steps since), when this boot began.
func sameBoot(e journal.Entry) bool {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil || e.MonoNS <= 0 || e.MonoNS > ts.Nano() {
		return false
	}
	then := e.At.Add(-time.Duration(e.MonoNS))
	now := time.Now().Add(-time.Duration(ts.Nano()))
	d := now.Sub(then)
	return d < time.Minute && d > -time.Minute
}

// userHZ is the unit of a process's start time in /proc/PID/stat: clock
// ticks, 100 a second on Linux whatever the kernel's HZ.
const userHZ = 100

// fromPidFiles rebuilds a running record when the journal lost its created
// line too (emptied, or torn with the record): from the pid and pgid files,
// written once after the group was verified, and the live leader. The pid
// file is a claim; it is taken only when the process at that PID is a
// live (not zombie) session leader (PID == PGID == SID) that started no later than the pid
// file was written, in this boot: a PID recycled since starts later. When
// the leader sits in a cgroup named for this run (RUN_ID.WRAPPER_PID), that
// is the run's cgroup, and its wrapper is the leader's parent of that PID.
// What only the lost lines said (the lease, the grace, escapes recorded
// outside a cgroup) is not known: the lease is deadline_epoch's (lease.
// Effective reads it when the journal names none), the grace is 0.
func fromPidFiles(d *rundir.Dir) (*Record, error) {
	pid, err := pidFile(d, rundir.PIDFile)
	if err != nil {
		return nil, err
	}
	if pgid, err := pidFile(d, rundir.PGIDFile); err != nil {
		return nil, err
	} else if pgid != pid {
		return nil, fmt.Errorf("the pid file says %d, the pgid file %d: they must agree", pid, pgid)
	}
	written, err := d.ModTime(rundir.PIDFile)
	if err != nil {
		return nil, err
	}
	st, err := proc.ReadStat(pid)
	if err != nil {
		return nil, fmt.Errorf("the pid file's leader %d is gone, and no line says who its group was", pid)
	}
	if st.Dead() {
		// A zombie leader says the job ended, and nothing says how the
		// run did: a stop may have ended it, with its record torn since.
		// Rebuilt as running, the run would move back from its end.
		return nil, fmt.Errorf("the pid file's leader %d has exited, and no line says how the run ended", pid)
	}
	if st.PGID != pid || st.SID != pid {
		return nil, fmt.Errorf("the pid file's %d is not a session leader now (pgid %d, sid %d): its PID was recycled", pid, st.PGID, st.SID)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return nil, err
	}
	// The pid file's mtime as clock ticks since this boot; one tick of
	// slack for the start time's rounding down.
	sinceBoot := written.Sub(time.Now().Add(-time.Duration(ts.Nano())))
	if sinceBoot < 0 {
		return nil, errors.New("the pid file was written before this boot")
	}
	if st.Start > uint64(sinceBoot/(time.Second/userHZ))+1 {
		return nil, fmt.Errorf("the process at the pid file's %d started after the file was written: its PID was recycled", pid)
	}
	boot, err := proc.BootID()
	if err != nil {
		return nil, err
	}
	at := Timestamp(written)
	r := &Record{Schema: Schema, RunID: d.ID, Rebuilt: true, State: Running, PID: pid, PGID: pid, SID: pid,
		LeaderStart: st.Start, BootID: boot, CreatedAt: at, StartedAt: at}
	if cg := cgroup.Of(pid); cg != "" && cgroup.Valid(cg) {
		name := filepath.Base(cg)
		if i := strings.LastIndexByte(name, '.'); i > 0 && name[:i] == d.ID {
			if w, err := strconv.Atoi(name[i+1:]); err == nil && w > 1 {
				r.Cgroup, r.Boundary = cg, "cgroup"
				if ws, err := proc.ReadStat(w); err == nil && st.PPID == w && ws.Start <= st.Start {
					r.WrapperPID, r.WrapperStart = w, ws.Start
				}
			}
		}
	}
	return r, nil
}

// pidFile reads a file of one PID and a newline.
func pidFile(d *rundir.Dir, name string) (int, error) {
	b, err := d.ReadFile(name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSuffix(string(b), "\n"))
	if err != nil || v <= 1 || !strings.HasSuffix(string(b), "\n") {
		return 0, fmt.Errorf("%s holds %q, not a PID", name, b)
	}
	return v, nil
}
