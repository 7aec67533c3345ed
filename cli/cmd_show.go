//go:build linux

package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/timeline"
)

// show is a judge: it reads the record, the journal and the process table
// (reconcile.Gather) and never signals or writes.

func init() {
	register(&command{
		name:     "show",
		summary:  "a run at a glance: its journal as a timeline, verified",
		synopsis: "show [--json] RUN_ID",
		help:     showHelp,
		exits:    "0 shown, journal intact; 1 shown, but the journal is broken or a file unreadable; 66 no such run; 64 usage; 78 unsafe run root or run directory",
		run:      runShow,
	})
}

const showHelp = `show draws the run's journal as a timeline, one line per event: the
journal line (SEQ), the time since the first line in ms (from mono_ns), who
acted (BY: wrapper, watchdog, cancel, renew, gateway, authorize) and what
happened. Lease renewals, and actions per channel, are counted into one
line between two other events. The head line is the judged state (as list
gives it: "lost" when nothing supervises a run whose record is not
terminal) and what reconcile says now; the bottom line is the hash chain's
verdict: a broken chain is named, and the lines from its first bad line on
are marked "!". Colour only on a terminal, never with NO_COLOR set.
--json prints the same as one JSON object (see docs/reference.md).`

func runShow(e *Env, args []string) int {
	fs := e.flags("show")
	asJSON := fs.Bool("json", false, "print the timeline as one JSON object")
	fs.SetInterspersed(true)
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("show takes one RUN_ID")
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()
	s := showRun(d)
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		enc.SetEscapeHTML(false)
		enc.Encode(s)
	} else {
		timeline.Render(e.Stdout, s, timeline.Options{Colour: e.colour(e.Stdout), Quote: controller.Quote})
	}
	if s.Healthy() {
		return ExitOK
	}
	switch {
	case s.JournalError != "":
		e.errorf("run %s: %s: %s", d.ID, rundir.EventsFile, s.JournalError)
		e.hint("without the journal, 'agent-wrap reconcile %s' judges the run from its record and the processes", d.ID)
	case !s.Verify.Intact && s.Verify.BadLine == 0:
		e.errorf("run %s: %s: %s", d.ID, rundir.EventsFile, s.Verify.Reason)
		e.hint("without the journal, 'agent-wrap reconcile %s' judges the run from its record and the processes", d.ID)
	case !s.Verify.Intact:
		e.errorf("run %s: %s: broken at line %d: %s", d.ID, rundir.EventsFile, s.Verify.BadLine, s.Verify.Reason)
		e.hint("the lines before %d are verified; 'agent-wrap verify %s' checks the chain alone", s.Verify.UntrustedFrom, d.ID)
	}
	if s.RecordError != "" {
		e.errorf("run %s: %s", d.ID, s.RecordError)
		e.hint("'agent-wrap reconcile %s' says what is known without the record", d.ID)
	}
	return ExitFailure
}

// showRun gathers one run's evidence and journal into a Show.
func showRun(d *rundir.Dir) *timeline.Show {
	in := reconcile.Gather(d)
	v := reconcile.Decide(in)
	s := &timeline.Show{RunID: d.ID, State: judgedState(in, v), Outcome: v.Outcome, Supervisor: v.Supervisor}
	if v.Outcome == reconcile.Unknown {
		s.Reason = v.Reason
	}
	s.FromRecord(in.Record)
	if in.Record == nil && in.RecordErr != nil {
		s.RecordError = in.RecordErr.Error()
	}
	raw, err := readJournal(d)
	if err != nil {
		s.JournalError = err.Error()
		s.Events = []timeline.Item{}
		return s
	}
	s.Events, s.Verify = timeline.Build(raw)
	if s.Events == nil {
		s.Events = []timeline.Item{}
	}
	return s
}

// maxJournal bounds what show reads of a journal: far beyond any run's
// (a line per event), small enough to hold.
const maxJournal = 64 << 20

func readJournal(d *rundir.Dir) ([]byte, error) {
	f, err := d.OpenFile(rundir.EventsFile, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJournal+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxJournal {
		return nil, errors.New("larger than 64 MiB; 'agent-wrap verify' checks it as a stream")
	}
	return b, nil
}
