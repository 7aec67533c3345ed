//go:build linux

package cli

import (
	"fmt"
	"os"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func init() {
	register(&command{
		name:     "status",
		summary:  "print a run's record: for a person, or status.json with --json",
		synopsis: "status [--json] RUN_ID",
		help:     statusHelp,
		exits:    "0; 1 the record is unreadable; 66 no such run; 64 usage; 78 unsafe run root",
		run:      runStatus,
	})
	register(&command{
		name:     "verify",
		summary:  "check a run's journal: hash chain and sequence",
		synopsis: "verify RUN_ID",
		exits:    "0 intact; 1 broken, naming the first bad line; 66 no such run; 64 usage; 78 unsafe run root",
		run:      runVerify,
	})
}

const statusHelp = `status prints the run's record for a person: the judged state (as list
gives it: "lost" when the record is not terminal and its wrapper is gone),
what reconcile says now, the command, the processes, the times, the lease
(its countdown only while a wrapper enforces it), the exit and the
survivors. --json prints the record itself, status.json, unchanged.
'agent-wrap show RUN_ID' draws the run's journal.`

func runStatus(e *Env, args []string) int {
	fs := e.flags("status")
	asJSON := fs.Bool("json", false, "print the record itself (status.json)")
	fs.SetInterspersed(true)
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("status takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	if *asJSON {
		rec, err := statusfile.Read(d)
		if err != nil {
			return e.unreadableRecord(d.ID, err)
		}
		b, _ := statusfile.Marshal(rec)
		e.Stdout.Write(b)
		return ExitOK
	}
	in := reconcile.Gather(d)
	if in.Record == nil {
		return e.unreadableRecord(d.ID, in.RecordErr)
	}
	writeStatus(e.Stdout, in, reconcile.Decide(in))
	return ExitOK
}

func (e *Env) unreadableRecord(id string, err error) int {
	e.errorf("%v", err)
	e.hint("the record is unreadable; 'agent-wrap reconcile %s' says what is known", id)
	return ExitFailure
}

func runVerify(e *Env, args []string) int {
	fs := e.flags("verify")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("verify takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		e.errorf("%v", err)
		return ExitFailure
	}
	defer f.Close()
	// The record names the journal's last line when it was written: a
	// journal cut at a line boundary still chains, but lacks it.
	var mark journal.Mark
	rec, rerr := statusfile.Read(d)
	if rerr == nil {
		mark = journal.Mark{Seq: rec.JournalSeq, Hash: rec.JournalHash}
	}
	n, err := journal.VerifyMark(f, mark)
	if err == nil && rerr == nil && statusfile.Terminal(rec.State) && !hasFinal(f) {
		err = fmt.Errorf("the record is %s, but the journal has no final line: it was cut after line %d", rec.State, n)
	}
	if err != nil {
		e.errorf("run %s: %s: %v", d.ID, rundir.EventsFile, err)
		return ExitFailure
	}
	fmt.Fprintf(e.Stdout, "%s: journal intact, %d events\n", d.ID, n)
	return ExitOK
}

// hasFinal reports whether the journal has a final line (journaled after
// every terminal record that landed).
func hasFinal(f *os.File) bool {
	if _, err := f.Seek(0, 0); err != nil {
		return true // cannot tell: say nothing
	}
	return len(journal.Evidence(f, "final")) > 0
}
