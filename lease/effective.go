package lease

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Effective returns the run's deadline as its journal has it: the
// deadline_epoch of the last lease_renewed line, else of the started line.
// The journal is the lease's record; deadline_epoch is a copy of it for
// readers, written after the journal line (Renew), so a deadline_epoch that
// is later (a hand-written deadline) or unreadable never moves the
// deadline: it is ignored, and note says so. One that is earlier stands (a
// run ends sooner, never later, than either says), with a note. Only where the journal
// names no deadline yet (a run still starting, or a journal that lost its
// lines) is deadline_epoch read instead (ReadDeadline, with its errors).
// A run without a lease is ErrNoDeadline.
func Effective(d *rundir.Dir) (epoch int64, note string, err error) {
	fileDL, ferr := ReadDeadline(d)
	jdl, ok := journaled(d)
	if !ok {
		return fileDL, "", ferr
	}
	switch {
	case jdl == 0 && errors.Is(ferr, ErrNoDeadline):
		return 0, "", ErrNoDeadline
	case jdl == 0:
		note = "deadline_epoch exists, but the run was started without a lease: ignored"
		return 0, note, ErrNoDeadline
	case ferr != nil:
		note = fmt.Sprintf("deadline_epoch is unreadable (%v); the journal's deadline %d stands", ferr, jdl)
	case fileDL > jdl:
		note = fmt.Sprintf("deadline_epoch says %d (%s), later than the journal's last deadline %d (%s): deadline_epoch is ignored; a lease moves only by renew, and an expired one never",
			fileDL, time.Unix(fileDL, 0).UTC().Format(time.RFC3339), jdl, time.Unix(jdl, 0).UTC().Format(time.RFC3339))
	case fileDL < jdl:
		// An earlier deadline ends the run sooner, the safe side: a
		// renewal whose line was torn, or whose file write failed, is
		// not trusted to have moved the lease.
		note = fmt.Sprintf("deadline_epoch says %d, earlier than the journal's last deadline %d: the earlier stands", fileDL, jdl)
		return fileDL, note, nil
	}
	return jdl, note, nil
}

// journaled returns the deadline of the journal's last started or
// lease_renewed line (0: started without a lease); ok is false when the
// journal has neither.
func journaled(d *rundir.Dir) (int64, bool) {
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, false
	}
	// Read backwards: a live run's last renewal is near the journal's end.
	e, found := journal.Last(f, fi.Size(), "started", "lease_renewed")
	if !found {
		return 0, false
	}
	v, ok := e.Fields["deadline_epoch"].(float64)
	if !ok || v < 0 {
		return 0, false
	}
	return int64(v), true
}
