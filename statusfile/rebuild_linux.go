package statusfile

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
		return nil, errNotCreated
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
