//go:build linux

package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/gc"
	"github.com/agent-wrap/agent-wrap/rundir"
)

func init() {
	register(&command{
		name:     "gc",
		summary:  "delete the directories of runs that ended long ago",
		synopsis: "gc --older-than D [--dry-run]",
		help:     gcHelp,
		exits:    "0; 1 a run directory could not be removed; 64 usage (--older-than missing); 78 unsafe run root",
		run:      runGC,
	})
}

const gcHelp = `gc deletes the run directories of runs that are over and ended more than D
ago, and prints one line per run removed. A run is removed only when
reconcile would say completed or cancelled and its wrapper has exited; a
live run, one whose outcome is unknown (an unreadable record, a wrapper that
died before its final record, a cancelled run with a process still alive) and
one that ended less than D ago are kept. Unknown runs are named on stderr:
they need 'agent-wrap reconcile' and perhaps 'agent-wrap cancel', not gc.`

// ageValue is a duration flag that also takes days ("7d"), the unit
// retention is usually thought in.
type ageValue struct{ durationValue }

func (a *ageValue) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days < 0 {
			return fmt.Errorf("not a number of days: %q", s)
		}
		a.durationValue = durationValue(time.Duration(days * float64(24*time.Hour)))
		return nil
	}
	return a.durationValue.Set(s)
}

func runGC(e *Env, args []string) int {
	fs := e.flags("gc")
	var older ageValue
	fs.Var(&older, "older-than", "remove terminal runs that ended more than `D` ago, like 90s, 36h or 7d; no default: it must be given")
	dry := fs.BoolP("dry-run", "n", false, "print what would be removed; remove nothing")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return e.usageError("gc takes no arguments")
	}
	if !fs.Changed("older-than") {
		return e.usageError("gc needs --older-than D: how long ago a run must have ended to be deleted")
	}
	root, ids, code := e.allRuns()
	if root == nil {
		return code
	}
	defer root.Close()
	exit := ExitOK
	cutoff := time.Now().Add(-time.Duration(older.durationValue))
	for _, id := range ids {
		if !e.collect(root, id, cutoff, *dry) {
			exit = ExitFailure
		}
	}
	return exit
}

// collect removes one run if gc's rule allows it; false means removal
// failed.
func (e *Env) collect(root *rundir.Root, id string, cutoff time.Time, dry bool) bool {
	res, err := gc.Collect(root, id, cutoff, dry)
	switch {
	case err != nil:
		e.errorf("gc: %v", err)
		return false
	case res.Kept != "":
		e.errorf("gc: kept %s: %s", id, res.Kept)
	case res.Removed && dry:
		fmt.Fprintln(e.Stdout, "would remove "+res.Line)
	case res.Removed:
		fmt.Fprintln(e.Stdout, "removed "+res.Line)
	}
	return true
}
