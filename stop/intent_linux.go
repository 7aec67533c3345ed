package stop

import (
	"errors"
	"fmt"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// errNotJournaled and errNotRecorded are what Intend can fail with.
var (
	// errNotJournaled: the intent is not on disk, so nothing may be
	// signalled on its strength (the wrapper, whose own job it is, stops
	// anyway and says so).
	errNotJournaled = errors.New("cannot journal the intent")
	// errNotRecorded: the intent is journaled and synced, but `cancelling`
	// could not be written. The synced line is the durable fact; a record
	// that cannot be written (a full disk) must not keep the job running.
	errNotRecorded = errors.New("the intent is journaled, but the cancelling record could not be written")
	// errTakenOver (with errNotRecorded): the record was made final
	// meanwhile, by a stop that went ahead without the run's lock while
	// this process held it and was stuck. That record stands.
	errTakenOver = errors.New("the run was stopped meanwhile by another process")
)

// Intend records the intent to stop the run in d, before any signal: unless
// the record on disk is already `cancelling` with a cause (whose cause then
// stands: it is returned, rec takes it, and nothing is written), it journals
// event with f and the cause and syncs the line, then sets rec to
// `cancelling` with cause and writes it with write. The caller holds the
// run's lock, and disk is the record as it read it under that lock (nil:
// unreadable), so the record is read once per intent: cancel and the
// watchdog decide on that record anyway, and the wrapper hands the same one
// to its write. appendLine journals (nil: journal.Append on d); the wrapper
// passes its own, so its journal has one writer.
//
// An error wrapping errNotJournaled leaves rec as it was; one wrapping
// errNotRecorded comes after the line was synced and rec set.
func Intend(d *rundir.Dir, rec, disk *statusfile.Record, event, cause string, f journal.Fields, appendLine func(event string, f journal.Fields, sync bool) error, write func(*statusfile.Record) error) (string, error) {
	if appendLine == nil {
		appendLine = func(event string, f journal.Fields, sync bool) error {
			_, err := journal.Append(d, event, f, sync)
			return err
		}
	}
	if disk != nil && disk.State == statusfile.Cancelling && disk.Cause != "" {
		rec.State, rec.Cause = disk.State, disk.Cause
		return disk.Cause, nil
	}
	g := journal.Fields{"cause": cause}
	for k, v := range f {
		g[k] = v
	}
	if err := appendLine(event, g, true); err != nil {
		return cause, fmt.Errorf("%w (%s): %v", errNotJournaled, event, err)
	}
	rec.State, rec.Cause = statusfile.Cancelling, cause
	if err := write(rec); err != nil {
		return cause, fmt.Errorf("%w: %w", errNotRecorded, err)
	}
	return cause, nil
}

// writeRecord is Intend's write for a caller outside the wrapper. It reads
// the record again first: a caller that was stopped while it held the
// lock (in the intent's fsync, say) may wake after a stop that bypassed
// the lock has written the final record, which it must not replace. One
// stopped inside this write finds its temp file removed by that stop, and
// its rename failing.
func writeRecord(d *rundir.Dir) func(*statusfile.Record) error {
	return func(rec *statusfile.Record) error {
		if disk, err := statusfile.Read(d); err == nil && statusfile.Terminal(disk.State) {
			return fmt.Errorf("%w: the record is %s", errTakenOver, disk.State)
		}
		err := statusfile.Write(d, rec, false)
		if err != nil {
			// Stopped inside the write, its temp file removed by the
			// stop that went ahead without the lock (stop.Options.Bypass).
			if disk, rerr := statusfile.Read(d); rerr == nil && statusfile.Terminal(disk.State) {
				return fmt.Errorf("%w: the record is %s", errTakenOver, disk.State)
			}
		}
		return err
	}
}
