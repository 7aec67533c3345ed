//go:build linux

package cli

import (
	"time"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

func init() {
	register(&command{
		name:     "wait",
		summary:  "wait for a run to end and exit with its code",
		synopsis: "wait [--timeout D] RUN_ID",
		help:     waitHelp,
		exits:    "as run would have exited for this run; 75 --timeout passed or the outcome is unknown; 66 no such run; 64 usage; 78 unsafe run root",
		run:      runWait,
	})
}

const waitHelp = `wait blocks until the run is terminal and exits as run would have: the
record's exit_code (the job's code, 128+N, 143/130/129 cancelled, 124 lease
expired, 127/126/70 launch failed).

It exits 75 with a message on stderr, and without waiting further, when
  - --timeout passes first (the run is still live), or
  - the outcome is unknown: the run is not terminal but its wrapper is dead
    and nothing of it is alive (or the host rebooted, or the record is
    unreadable) for a few seconds on end. Nothing will ever finish such a run
    but 'agent-wrap cancel'; 'agent-wrap reconcile' says what is known.
75 is what running the same ID again would return for a live or unknown run.
`

func runWait(e *Env, args []string) int {
	fs := e.flags("wait")
	var timeout durationValue
	fs.Var(&timeout, "timeout", "give up after `D` and exit 75; 0 waits as long as the run lives")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("wait takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()

	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(time.Duration(timeout))
	}
	f := newFollower(d, false)
	defer f.Close()
	for {
		rec, v := f.poll()
		if rec != nil {
			return rec.Code()
		}
		if v != nil {
			e.errorf("run %s: outcome unknown: %s", d.ID, v.Reason)
			e.hint("nothing will finish this run by itself; 'agent-wrap reconcile %s' shows the evidence, 'agent-wrap cancel %s' records a final state", d.ID, d.ID)
			return ExitTempFail
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			state := "not terminal"
			if r, err := statusfile.Read(d); err == nil {
				state = r.State
			}
			e.errorf("run %s: still %s after %v; stopped waiting (the run goes on)", d.ID, state, time.Duration(timeout))
			return ExitTempFail
		}
		var limit time.Duration // none: the follower's own
		if !deadline.IsZero() {
			limit = max(time.Until(deadline), time.Millisecond)
		}
		f.sleep(limit)
	}
}
