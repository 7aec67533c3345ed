//go:build linux

package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/reconcile"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// writeStatus draws a run's record for a person (status without --json):
// one field a line, what is not known left out, the judged state first.
func writeStatus(w io.Writer, in reconcile.Input, v reconcile.Verdict) {
	rec := in.Record
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	state := judgedState(in, v)
	outcome := v.Outcome
	if outcome == reconcile.Running && v.Supervisor == reconcile.SupervisorLost {
		outcome = "running (supervisor lost)"
	}
	fmt.Fprintf(w, "run %s: %s; reconcile: %s\n", rec.RunID, state, outcome)
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "  %s:\t"+format+"\n", append([]any{k}, a...)...) }
	if state != rec.State {
		row("record", "%s (the record's own state; its wrapper is gone)", rec.State)
	}
	if v.Outcome == reconcile.Unknown && v.Reason != "" {
		row("why unknown", "%s", v.Reason)
	}
	row("command", "%s", controller.Quote(rec.Command...))
	if rec.PID > 0 {
		row("pid", "%d (pgid %d, sid %d)", rec.PID, rec.PGID, rec.SID)
	}
	wrapper := "gone"
	if in.WrapperAlive {
		wrapper = "alive"
	}
	if statusfile.Terminal(rec.State) && !in.WrapperAlive {
		wrapper = "exited"
	}
	row("wrapper", "pid %d, %s", rec.WrapperPID, wrapper)
	row("created", "%s", ago(rec.CreatedAt, now))
	if rec.StartedAt != "" {
		row("started", "%s", ago(rec.StartedAt, now))
	}
	if rec.EndedAt != "" {
		row("ended", "%s", ago(rec.EndedAt, now))
	}
	row("lease", "%s", leaseLine(in, state, now))
	row("grace", "%s", secondsText(rec.GraceSeconds))
	if rec.Boundary != "" {
		row("boundary", "%s", strings.TrimSpace(rec.Boundary+" "+rec.Cgroup))
	}
	if rec.AgentSocket != "" {
		row("ssh agent", "scoped: %s", rec.AgentSocket)
	}
	if rec.Cause != "" {
		row("cause", "%s", rec.Cause)
	}
	if rec.ExitCode != nil {
		t := fmt.Sprint(*rec.ExitCode)
		if rec.Signal != "" {
			t += " (the leader died of " + rec.Signal + ")"
		}
		row("exit", "%s", t)
	}
	if rec.Error != "" {
		row("error", "%s", rec.Error)
	}
	for _, x := range rec.Escaped {
		row("escaped", "pid %d (pgid %d, sid %d) %s", x.PID, x.PGID, x.SID, controller.Quote(x.Argv...))
	}
	for _, h := range rec.Handoffs {
		t := fmt.Sprintf("run %s on %s: %s", h.RunID, h.Dest, h.Outcome)
		if h.ExitCode != nil {
			t += fmt.Sprintf(", exit %d", *h.ExitCode)
		}
		row("handoff", "%s", t)
	}
	if len(v.Evidence.Members) > 0 && statusfile.Terminal(rec.State) {
		row("alive", "%s", pidList(v.Evidence.Members))
	}
	if statusfile.Terminal(rec.State) {
		if rec.Containment != "" {
			row("containment", "%s", rec.Containment)
		}
		if rec.SurvivorsUnknown() {
			row("survivors", "unknown: %s", survivorsUnknown)
		} else if len(rec.Survivors) == 0 {
			row("survivors", "none")
		} else {
			row("survivors", "%v", rec.Survivors)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "the journal: 'agent-wrap show %s'; the record as JSON: 'agent-wrap status --json %s'\n", rec.RunID, rec.RunID)
}

// leaseLine is the lease as status gives it: its countdown only while a
// wrapper enforces it.
func leaseLine(in reconcile.Input, state string, now time.Time) string {
	rec := in.Record
	if rec.LeaseSeconds == 0 {
		return "none"
	}
	t := secondsText(rec.LeaseSeconds)
	if in.Deadline == 0 || statusfile.Terminal(rec.State) {
		return t
	}
	dl := time.Unix(in.Deadline, 0)
	t += ", deadline " + dl.UTC().Format("2006-01-02 15:04:05Z")
	switch {
	case state == stateLost:
		t += " (nothing enforces it: its wrapper is gone; the watchdog or 'agent-wrap cancel' acts on it)"
	case !dl.After(now):
		t += " (passed)"
	default:
		t += fmt.Sprintf(" (%s left)", dl.Sub(now).Truncate(time.Second))
	}
	return t
}

func ago(ts string, now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	return fmt.Sprintf("%s (%s ago)", ts, now.Sub(t).Truncate(time.Millisecond))
}

func pidList(ms []reconcile.Member) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%d (%s)", m.PID, m.Comm)
	}
	return strings.Join(parts, ", ")
}
