//go:build linux

package cli

import "github.com/agent-wrap/agent-wrap/rundir"

func init() {
	register(&command{
		name:     "logs",
		summary:  "print a run's log; with -f, follow it until the run is over",
		synopsis: "logs [-f] [--stderr] RUN_ID",
		help:     logsHelp,
		exits:    "0; 4 with -f, the run can never end by itself (its outcome is unknown); 66 no such run; 64 usage; 78 unsafe run root",
		run:      runLogs,
	})
}

const logsHelp = `logs prints the job's stdout.log (--stderr: stderr.log) byte for byte, from
the start. With -f it goes on printing what the job writes until the run is
terminal, then prints the rest and exits 0: this is how a controller
reattaches after losing its connection.

If the run can never become terminal by itself (its wrapper is dead and
nothing of it is alive, the host rebooted, or the record is unreadable, for a
few seconds on end), -f prints what there is, says so on stderr and exits 4,
the exit code reconcile gives an unknown outcome.
`

func runLogs(e *Env, args []string) int {
	fs := e.flags("logs")
	follow := fs.BoolP("follow", "f", false, "follow the log until the run is terminal")
	errLog := fs.Bool("stderr", false, "print stderr.log instead of stdout.log")
	fs.SetInterspersed(true) // no job argv here: flags may follow RUN_ID
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("logs takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	name := rundir.StdoutFile
	if *errLog {
		name = rundir.StderrFile
	}

	l := &logReader{e: e, d: d, name: name, w: e.Stdout}
	defer l.close()
	if !*follow {
		if err := l.copy(); err != nil {
			return l.fail(err)
		}
		if l.f == nil {
			e.errorf("run %s has no %s (yet): its job never started, or has not started yet", d.ID, name)
		}
		return ExitOK
	}
	rec, v, code := followLogs(e, d, l)
	switch {
	case rec != nil:
		return ExitOK
	case v != nil:
		e.errorf("run %s: stopped following: the outcome is unknown: %s", d.ID, v.Reason)
		e.hint("'agent-wrap reconcile %s' shows the evidence", d.ID)
		return ExitUnknown
	}
	return code
}
