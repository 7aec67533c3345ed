package timeline

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Show is one run at a glance: its judged state, its record's summary and
// its timeline. `agent-wrap show --json` prints it as one JSON object.
type Show struct {
	RunID string `json:"run_id"`
	// State is the judged state, as list gives it: the record's, "lost"
	// when the record is not terminal and nothing supervises the run,
	// "unreadable" without a readable record.
	State       string   `json:"state"`
	RecordState string   `json:"record_state"` // the record's own state; "" when unreadable
	Outcome     string   `json:"outcome"`      // what reconcile says now
	Supervisor  string   `json:"supervisor"`   // alive, lost or none
	Reason      string   `json:"reason,omitempty"`
	ExitCode    *int     `json:"exit_code"`
	Cause       string   `json:"cause,omitempty"`
	Command     []string `json:"command,omitempty"`
	CreatedAt   string   `json:"created_at,omitempty"`
	EndedAt     string   `json:"ended_at,omitempty"`
	RecordError string   `json:"record_error,omitempty"` // why status.json could not be read
	// JournalError is why the journal could not be read at all.
	JournalError string `json:"journal_error,omitempty"`
	Events       []Item `json:"events"`
	Verify       Verify `json:"verify"`
}

// FromRecord fills the record's part of s.
func (s *Show) FromRecord(rec *statusfile.Record) {
	if rec == nil {
		return
	}
	s.RecordState, s.ExitCode, s.Cause = rec.State, rec.ExitCode, rec.Cause
	s.Command, s.CreatedAt, s.EndedAt = rec.Command, rec.CreatedAt, rec.EndedAt
}

// Healthy reports whether everything show reads was read and the chain is
// intact.
func (s *Show) Healthy() bool {
	return s.RecordError == "" && s.JournalError == "" && s.Verify.Intact
}

// colour is the ANSI colour of a kind (a switch: a package-level map
// literal would be built at every start of the binary).
func colour(kind string) (string, bool) {
	switch kind {
	case KindIntent, KindProblem:
		return "\x1b[1;31m", true
	case KindSignal:
		return "\x1b[31m", true
	case KindEscape:
		return "\x1b[33m", true
	case KindRevoke:
		return "\x1b[35m", true
	case KindFinal:
		return "\x1b[32m", true
	case KindRenew:
		return "\x1b[2m", true
	case KindAction:
		return "\x1b[36m", true
	case KindHandoff:
		return "\x1b[34m", true
	}
	return "", false
}

const reset = "\x1b[0m"

// Options say how Render draws.
type Options struct {
	// Colour adds ANSI colours, to the last column only, so the columns
	// stay aligned.
	Colour bool
	// Quote joins the command's words as a shell would read them back;
	// nil joins them with spaces.
	Quote func(words ...string) string
}

// Render draws s for a person: a head line, the command, one line per
// timeline item (journal line or range, ms since the first line, who, what)
// and the chain's verdict at the bottom.
func Render(w io.Writer, s *Show, o Options) {
	paint := func(kind, text string) string {
		if c, ok := colour(kind); ok && o.Colour {
			return c + text + reset
		}
		return text
	}
	fmt.Fprintf(w, "run %s: %s\n", s.RunID, head(s))
	if s.RecordState != "" && s.RecordState != s.State {
		fmt.Fprintf(w, "  record: %s (the record's own state; nothing supervises the run)\n", s.RecordState)
	}
	if len(s.Command) > 0 {
		cmd := strings.Join(s.Command, " ")
		if o.Quote != nil {
			cmd = o.Quote(s.Command...)
		}
		fmt.Fprintf(w, "  command: %s\n", cmd)
	}
	if s.CreatedAt != "" {
		t := "  created: " + s.CreatedAt
		if s.EndedAt != "" {
			t += ", ended: " + s.EndedAt
		}
		fmt.Fprintln(w, t)
	}
	if s.RecordError != "" {
		fmt.Fprintln(w, paint(KindProblem, "  record unreadable: "+s.RecordError))
	}
	if s.Reason != "" && s.Outcome == "unknown" {
		fmt.Fprintf(w, "  why unknown: %s\n", s.Reason)
	}
	if len(s.Events) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  \tSEQ\tMS\tBY\t WHAT")
		for _, it := range s.Events {
			mark := " "
			if it.Untrusted {
				mark = "!"
			}
			seq, ms := fmt.Sprint(it.Seq), fmt.Sprint(it.MS)
			if it.Count > 1 {
				seq += "-" + fmt.Sprint(it.LastSeq)
				ms += "-" + fmt.Sprint(it.LastMS)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t %s\n", mark, seq, ms, it.Actor, paint(it.Kind, it.Text))
		}
		tw.Flush()
	}
	switch {
	case s.JournalError != "":
		fmt.Fprintln(w, paint(KindProblem, "journal: cannot be read: "+s.JournalError))
	case s.Verify.Intact:
		fmt.Fprintln(w, paint(KindFinal, fmt.Sprintf("journal: intact, %d lines, hash chain verified", s.Verify.Lines)))
	case s.Verify.BadLine == 0:
		fmt.Fprintln(w, paint(KindProblem, "journal: BROKEN: "+s.Verify.Reason))
	default:
		fmt.Fprintln(w, paint(KindProblem, fmt.Sprintf("journal: BROKEN at line %d: %s; lines from %d on (marked !) are not trusted", s.Verify.BadLine, s.Verify.Reason, s.Verify.UntrustedFrom)))
	}
}

// head is the first line: the judged state, the exit code, the cause and
// what reconcile says.
func head(s *Show) string {
	t := s.State
	if s.Cause != "" {
		t += " (" + s.Cause + ")"
	}
	if s.ExitCode != nil {
		t += fmt.Sprintf(", exit %d", *s.ExitCode)
	}
	o := s.Outcome
	if o == "running" && s.Supervisor == "lost" {
		o = "running (supervisor lost)"
	}
	if o != "" {
		t += "; reconcile: " + o
	}
	return t
}
