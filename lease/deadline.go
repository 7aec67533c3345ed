// Package lease holds a run's deadline: the deadline_epoch file and its
// renewal (Renew). The wrapper enforces the deadline while it lives; the
// watchdog that stops runs whose lease expired after their wrapper died is
// package watchdog.
//
// A lease is final once it has expired: renewal after the deadline is
// refused, as in etcd and Consul, so a controller that lost contact can
// never revive a run the host has already started to stop. The deadline is
// whole Unix seconds, rounded up, so a lease is never shorter than asked.
package lease

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/agent-wrap/agent-wrap/rundir"
)

// ParseDeadline parses the content of deadline_epoch: decimal Unix seconds
// and a newline.
func ParseDeadline(b []byte) (int64, error) {
	s := bytes.TrimSuffix(b, []byte("\n"))
	if len(s) == 0 || len(s) > 19 {
		return 0, fmt.Errorf("deadline_epoch %q is not decimal Unix seconds", truncate(b))
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("deadline_epoch %q is not decimal Unix seconds", truncate(b))
		}
	}
	v, err := strconv.ParseInt(string(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("deadline_epoch %q: %v", truncate(b), err)
	}
	return v, nil
}

func truncate(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

// FormatDeadline renders a deadline as the file holds it.
func FormatDeadline(epoch int64) []byte {
	return []byte(strconv.FormatInt(epoch, 10) + "\n")
}

// DeadlineAfter returns the deadline for a lease of d starting at now:
// whole seconds, rounded up.
func DeadlineAfter(now time.Time, d time.Duration) int64 {
	return int64(math.Ceil(float64(now.Add(d).UnixNano()) / 1e9))
}

// ErrNoDeadline is returned by ReadDeadline when the run has no lease.
var ErrNoDeadline = errors.New("run has no lease (no deadline_epoch)")

// ReadDeadline reads a run's deadline. A run without a lease has no file:
// ErrNoDeadline.
func ReadDeadline(d *rundir.Dir) (int64, error) {
	b, err := d.ReadFile(rundir.DeadlineFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, ErrNoDeadline
		}
		return 0, err
	}
	return ParseDeadline(b)
}

// WriteDeadline replaces a run's deadline atomically (never empty or torn
// for any process of this boot), and fsyncs nothing: a deadline matters
// only while the run can be live, that is within this boot, and the page
// cache keeps it for every process of this boot. After a crash of the
// machine the new boot_id makes the run unknown whatever the file holds, and
// no one signals anything on its word (see statusfile.Write).
func WriteDeadline(d *rundir.Dir, epoch int64) error {
	return d.WriteAtomic(rundir.DeadlineFile, FormatDeadline(epoch), rundir.Visible)
}
