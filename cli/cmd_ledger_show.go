package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/timeline"
)

// `ledger show` is the controller's view of one run: its ledger record,
// then the host's timeline of it, asked for over the run's own rsh (one
// read-only call, `show --json`). It writes nothing. It is a word of
// `ledger` (whose synopsis names it), not an entry of the command table,
// so it prints its own --help, in the table's format.

// ledgerShowExits are ledger show's exit codes, as its --help gives them.
const ledgerShowExits = "0 shown; 1 the host's journal is broken or a file of the run unreadable there; 66 no such run in the ledger; 255 the host could not be asked; 64 usage; 78 unsafe ledger"

const ledgerShowSynopsis = "ledger show [--json] [--local] [--timeout D] [--ledger DIR|URL] RUN_ID"

const ledgerShowHelp = `'ledger show RUN_ID' prints the run as this controller recorded it
(destination, command, state, outcome, exit, times, what was delivered),
then asks its host, over the run's own --rsh, destination, remote binary
and root, for the run's timeline ('agent-wrap show --json' there) and draws
it as 'show' does. --local leaves the host out; --json prints one object:
"ledger" (the record), "host" (the host's show, or null) and "host_error".
When the host cannot be asked, the ledger's part is still printed.`

// ledgerShowDoc is what `ledger show --json` prints.
type ledgerShowDoc struct {
	Ledger    *ledger.Record `json:"ledger"`
	Host      *timeline.Show `json:"host"`
	HostError string         `json:"host_error,omitempty"`
}

func runLedgerShow(e *Env, args []string) int {
	fs := e.flags("ledger show")
	asJSON := fs.Bool("json", false, "print the record and the host's timeline as one JSON object")
	local := fs.Bool("local", false, "the ledger's record only: do not ask the host")
	timeout := durationValue(time.Minute)
	fs.Var(&timeout, "timeout", "how long the call to the host may take, `D`")
	ledgerDir := fs.String("ledger", "", ledgerFlagUsage)
	fs.SetInterspersed(true)
	_ = fs.MarkHidden("root")
	if code, ok := e.parseWord(fs, args, ledgerShowSynopsis, "one run as the ledger holds it, then its host's timeline of it", ledgerShowHelp, ledgerShowExits); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("ledger show takes one RUN_ID")
	}
	id := fs.Arg(0)
	if code := e.checkIDs(id); code != 0 {
		return code
	}
	l, code := e.openLedger(*ledgerDir, false)
	if l == nil {
		return code
	}
	defer l.Close()
	rec, err := l.Read(e.Ctx, id)
	if err != nil {
		e.errorf("%v", err)
		if errors.Is(err, ledger.ErrNoRecord) {
			e.hint("'agent-wrap ledger' lists the runs of this ledger; pass the --ledger the run used")
			return ExitNoRun
		}
		if errors.Is(err, rundir.ErrUnsafe) {
			e.hint("a ledger record must be a regular file of yours, mode 0600")
			return ExitUnsafeRoot
		}
		return ExitFailure
	}
	doc := ledgerShowDoc{Ledger: rec}
	code = ExitOK
	if !*local {
		s, hcode, err := controller.HostShow(e.Ctx, rec, e.sshLogDir(l), time.Duration(timeout))
		doc.Host = s
		switch {
		case err == nil && hcode != 0:
			code = ExitFailure
		case errors.Is(err, controller.ErrHostNoRun):
			doc.HostError = err.Error()
		case err != nil:
			doc.HostError = err.Error()
			code = 255
		}
	}
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		enc.SetEscapeHTML(false)
		enc.Encode(doc)
	} else {
		writeLedgerRecord(e.Stdout, rec, time.Now())
		switch {
		case doc.Host != nil:
			fmt.Fprintf(e.Stdout, "on %s:\n", rec.Dest)
			timeline.Render(e.Stdout, doc.Host, timeline.Options{Colour: e.colour(e.Stdout), Quote: controller.Quote})
		case *local:
		default:
			fmt.Fprintf(e.Stdout, "on %s: %s\n", rec.Dest, doc.HostError)
		}
	}
	switch code {
	case 255:
		e.errorf("run %s: the host's timeline: %s", id, doc.HostError)
		e.hint("'agent-wrap ledger show --local %s' shows the ledger's part alone; 'agent-wrap settle %s' records the outcome once the host answers", id, id)
	case ExitFailure:
		e.errorf("run %s on %s: the host's journal is not intact or a file of the run is unreadable (see the timeline's last line)", id, rec.Dest)
	}
	return code
}

// writeLedgerRecord draws a ledger record for a person, one field a line,
// what is not known left out.
func writeLedgerRecord(w io.Writer, r *ledger.Record, now time.Time) {
	t := r.State
	if r.Outcome != "" {
		t += ", " + r.Outcome
	}
	if r.ExitCode != nil {
		t += fmt.Sprintf(", exit %d", *r.ExitCode)
	}
	fmt.Fprintf(w, "run %s (ledger): %s\n", r.RunID, t)
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "  %s:\t"+format+"\n", append([]any{k}, a...)...) }
	row("dest", "%s", r.Dest)
	row("command", "%s", controller.Quote(r.Command...))
	if r.Cause != "" {
		row("cause", "%s", r.Cause)
	}
	if r.Reason != "" {
		row("reason", "%s", r.Reason)
	}
	if r.CancelRequested {
		row("cancel", "requested (INT, TERM or HUP reached the controller)")
	}
	row("created", "%s (%s ago)", ts(r.CreatedAt), now.Sub(r.CreatedAt).Truncate(time.Millisecond))
	row("updated", "%s", ts(r.UpdatedAt))
	if !r.SettledAt.IsZero() {
		row("settled", "%s (%s after it was created)", ts(r.SettledAt), r.SettledAt.Sub(r.CreatedAt).Truncate(time.Millisecond))
	}
	row("lease", "%s, grace %s", secondsText(r.Lease), secondsText(r.Grace))
	if r.RemotePID > 0 {
		row("remote", "pid %d, boot %s", r.RemotePID, r.BootID)
	}
	if r.StdoutBytes > 0 || r.StderrBytes > 0 || r.StdoutClosed || r.StderrClosed {
		gone := func(closed bool) string {
			if closed {
				return " (then its reader went away)"
			}
			return ""
		}
		row("delivered", "stdout %d bytes%s, stderr %d bytes%s", r.StdoutBytes, gone(r.StdoutClosed), r.StderrBytes, gone(r.StderrClosed))
	}
	if r.ControllerPID > 0 {
		row("controller", "pid %d", r.ControllerPID)
	}
	tw.Flush()
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// secondsText is a record's seconds field as a duration (2m30s); status
// and ledger show print them so.
func secondsText(s float64) string {
	if s == 0 {
		return "0s"
	}
	return (time.Duration(s * float64(time.Second))).String()
}
