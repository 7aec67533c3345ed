package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/internal/durflag"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/mcpserver/config"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds of the tools' arguments.
const (
	defaultWait     = 60 * time.Second
	maxWait         = 24 * time.Hour
	tailBytes       = 4 << 10  // the tails a run result carries
	defaultLogBytes = 64 << 10 // logs' max_bytes by default
	maxLogBytes     = 1 << 20
	progressEvery   = 250 * time.Millisecond // at most four progress notifications a second
	listMax         = 200
	verdictTimeout  = 60 * time.Second
)

// RunIn is the run tool's input.
type RunIn struct {
	Dest        string   `json:"dest" jsonschema:"the ssh destination, [user@]host as for ssh; it must match one of the server's --allow patterns"`
	Argv        []string `json:"argv,omitempty" jsonschema:"the command and its arguments, arriving on the host word for word (give argv or command)"`
	Command     string   `json:"command,omitempty" jsonschema:"a shell command line, run on the host as sh -c COMMAND (give argv or command)"`
	Stdin       string   `json:"stdin,omitempty" jsonschema:"text given to the job on its standard input, byte for byte, then end of file; without it the job's stdin is empty (/dev/null)"`
	WaitSeconds *float64 `json:"wait_seconds,omitempty" jsonschema:"how long to wait for the run's end before returning it as running (default 60; 0 returns at once)"`
	Lease       string   `json:"lease,omitempty" jsonschema:"the run's lease, renewed while this server follows it: a duration such as 10m, or seconds; 0 for none (default the server's --lease, else 5m)"`
	Grace       string   `json:"grace,omitempty" jsonschema:"time between TERM and KILL when the run is stopped (default the server's --grace, else 5s)"`
	RunID       string   `json:"run_id,omitempty" jsonschema:"the run ID to use (letters, digits, dot, underscore, dash; default 128 random bits); a run ID already in the ledger is refused, so a retried call never runs the command twice"`
}

// RunOut is a run as a tool result: run, wait and cancel give it.
type RunOut struct {
	RunID       string `json:"run_id"`
	Dest        string `json:"dest"`
	State       string `json:"state" jsonschema:"running while the run goes on; settled once its outcome is recorded; launching or detached when the outcome could not be learned (status asks the host again)"`
	LedgerState string `json:"ledger_state" jsonschema:"the ledger record's state: launching, running, detached, cancel_requested or settled"`
	Outcome     string `json:"outcome,omitempty" jsonschema:"once settled: completed, cancelled, unknown or not_started"`
	ExitCode    *int   `json:"exit_code,omitempty" jsonschema:"the run's exit code as agent-wrap run gives it (143 for a cancel, 124 for an expired lease)"`
	Cause       string `json:"cause,omitempty" jsonschema:"why a cancelled run stopped: cancel, lease, signal:TERM..."`
	Reason      string `json:"reason,omitempty" jsonschema:"why the outcome is unknown or the run was not started, or why the connection was lost"`
	CancelledBy string `json:"cancelled_by,omitempty" jsonschema:"who asked this server for the cancel: client (a cancelled request), tool (the cancel tool), exit (the client went away), launch (the host could not be reached)"`
	Confirmed   bool   `json:"confirmed" jsonschema:"true once the outcome is the host's own word: the run completed, or its cancel was confirmed and its process tree is gone"`
	Stdout      Tail   `json:"stdout"`
	Stderr      Tail   `json:"stderr"`
}

// Tail is the end of one stream.
type Tail struct {
	Text  string `json:"text" jsonschema:"the last bytes of the stream (up to 4 KiB), as text"`
	From  int64  `json:"from" jsonschema:"the byte offset where text starts"`
	Bytes int64  `json:"bytes" jsonschema:"the stream's length so far: logs from this offset reads what comes next"`
}

// WaitIn is the wait tool's input.
type WaitIn struct {
	RunID   string   `json:"run_id" jsonschema:"the run, as run gave it"`
	Seconds *float64 `json:"seconds,omitempty" jsonschema:"how long to wait for the run's end (default 60)"`
}

// LogsIn is the logs tool's input.
type LogsIn struct {
	RunID    string `json:"run_id" jsonschema:"the run, as run gave it"`
	Stream   string `json:"stream,omitempty" jsonschema:"stdout (default) or stderr"`
	From     int64  `json:"from,omitempty" jsonschema:"the byte offset to read from (default 0)"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes (default 65536, at most 1048576)"`
}

// LogsOut is the logs tool's result.
type LogsOut struct {
	RunID    string `json:"run_id"`
	Stream   string `json:"stream"`
	From     int64  `json:"from"`
	Next     int64  `json:"next" jsonschema:"the offset after the bytes returned: the next call's from"`
	Size     int64  `json:"size" jsonschema:"the stream's length so far"`
	Data     string `json:"data" jsonschema:"the bytes from..next, exactly: as text when they are UTF-8, else base64"`
	Encoding string `json:"encoding" jsonschema:"text or base64"`
	Done     bool   `json:"done" jsonschema:"true when the run is over and next is the stream's end: nothing more will come"`
}

// CancelIn is the cancel tool's input.
type CancelIn struct {
	RunID string   `json:"run_id" jsonschema:"the run, as run gave it"`
	Grace *float64 `json:"grace,omitempty" jsonschema:"seconds between TERM and KILL when the host's cancel stops the run itself because its wrapper is gone; a live wrapper stops the run with the run's own grace"`
}

// IDIn names a run.
type IDIn struct {
	RunID string `json:"run_id" jsonschema:"the run"`
}

// StatusOut is the status tool's result: the ledger's record beside the
// host's verdict.
type StatusOut struct {
	RunID     string         `json:"run_id"`
	Following bool           `json:"following" jsonschema:"true while this server follows the run (it started it and it is not settled)"`
	Ledger    map[string]any `json:"ledger" jsonschema:"the ledger's record of the run"`
	Host      map[string]any `json:"host,omitempty" jsonschema:"the host's verdict (agent-wrap reconcile --json): outcome, exit_code, reason, evidence"`
	HostError string         `json:"host_error,omitempty" jsonschema:"why the host could not give a verdict"`
}

// ListOut is the list tool's result.
type ListOut struct {
	Ledger    string      `json:"ledger"`
	Runs      []ListEntry `json:"runs"`
	Truncated bool        `json:"truncated" jsonschema:"true when only the newest runs are listed"`
}

// ListEntry is one run in list.
type ListEntry struct {
	RunID     string   `json:"run_id"`
	Dest      string   `json:"dest"`
	State     string   `json:"state"`
	Outcome   string   `json:"outcome,omitempty"`
	ExitCode  *int     `json:"exit_code,omitempty"`
	Command   []string `json:"command"`
	CreatedAt string   `json:"created_at"`
	Following bool     `json:"following" jsonschema:"true while this server follows the run"`
}

func (s *Server) addTools() {
	yes, no := true, false
	// run starts anything on a host; cancel stops a run (a second cancel
	// does nothing more); the rest only read, though a wait's cancelled
	// request cancels its run.
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "run", Description: "Start a command on a remote host under agent-wrap and wait up to wait_seconds for its end. The result has the run_id, state (running or settled), outcome, exit_code and the tails of stdout and stderr with their byte offsets. Cancelling this request cancels the run on its host, confirmed.",
		Annotations: &mcp.ToolAnnotations{Title: "Run a command on a host", DestructiveHint: &yes, OpenWorldHint: &yes}}, s.toolRun)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "wait", Description: "Wait up to seconds for a run's end; the same result as run. Cancelling this request cancels the run on its host, confirmed.",
		Annotations: &mcp.ToolAnnotations{Title: "Wait for a run", DestructiveHint: &no, OpenWorldHint: &yes}}, s.toolWait)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "logs", Description: "Read a run's stdout or stderr from a byte offset: the bytes exactly, and the next offset.",
		Annotations: &mcp.ToolAnnotations{Title: "Read a run's output", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no}}, s.toolLogs)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "cancel", Description: "Cancel a run: the host stops its whole process tree (TERM, grace, KILL) and confirms it. The result is the confirmed outcome, or unknown with the reason.",
		Annotations: &mcp.ToolAnnotations{Title: "Cancel a run, confirmed", DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &yes}}, s.toolCancel)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "status", Description: "A run's ledger record beside its host's verdict (completed, cancelled, running or unknown, with the evidence).",
		Annotations: &mcp.ToolAnnotations{Title: "A run's record and its host's verdict", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &yes}}, s.toolStatus)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "list", Description: "The runs in the ledger, newest first, with those this server follows marked.",
		Annotations: &mcp.ToolAnnotations{Title: "The ledger's runs", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no}}, s.toolList)
}

func (s *Server) toolRun(ctx context.Context, req *mcp.CallToolRequest, in RunIn) (*mcp.CallToolResult, RunOut, error) {
	if err := checkDest(in.Dest); err != nil {
		return nil, RunOut{}, err
	}
	if err := s.checkAllowed(in.Dest); err != nil {
		return nil, RunOut{}, err
	}
	argv, err := commandOf(in)
	if err != nil {
		return nil, RunOut{}, err
	}
	wait, err := waitFor("wait_seconds", in.WaitSeconds)
	if err != nil {
		return nil, RunOut{}, err
	}
	lease, err := durationArg("lease", in.Lease, config.Duration(s.cfg.Lease, 0))
	if err != nil {
		return nil, RunOut{}, err
	}
	if in.Lease != "" && lease == 0 || in.Lease == "" && s.cfg.Lease == 0 {
		lease = -1 // no lease (controller.Config.Lease)
	}
	grace, err := durationArg("grace", in.Grace, config.Duration(s.cfg.Grace, 0))
	if err != nil {
		return nil, RunOut{}, err
	}
	if in.RunID != "" {
		if err := rundir.ValidID(in.RunID); err != nil {
			return nil, RunOut{}, fmt.Errorf("run_id: %v; nothing was started", err)
		}
	}
	lr, err := s.start(in.Dest, in.RunID, argv, in.Stdin, lease, grace)
	if err != nil {
		return nil, RunOut{}, err
	}
	return s.await(ctx, req, lr, wait, true)
}

func (s *Server) toolWait(ctx context.Context, req *mcp.CallToolRequest, in WaitIn) (*mcp.CallToolResult, RunOut, error) {
	if err := s.checkAllowed(""); err != nil {
		return nil, RunOut{}, err
	}
	wait, err := waitFor("seconds", in.Seconds)
	if err != nil {
		return nil, RunOut{}, err
	}
	lr := s.live(in.RunID)
	if lr == nil {
		rec, err := s.record(ctx, in.RunID)
		if err != nil {
			return nil, RunOut{}, err
		}
		return nil, recordOut(rec), nil
	}
	return s.await(ctx, req, lr, wait, false)
}

// await waits up to d for lr's end, sending progress when asked. The
// request cancelled by the client is a confirmed cancel of the run,
// answered once the run is settled. For run (launch set), a launch that
// could not connect cancels the run before it starts and is an error.
func (s *Server) await(ctx context.Context, req *mcp.CallToolRequest, lr *liveRun, d time.Duration, launch bool) (*mcp.CallToolResult, RunOut, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	var tick <-chan time.Time
	tok := req.Params.GetProgressToken()
	if tok != nil {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		tick = t.C
	}
	lost := lr.lost
	if !launch {
		lost = nil
	}
	var sent int64
	for {
		select {
		case <-lr.done:
			return s.finalOut(lr)
		case <-timer.C:
			return nil, s.liveOut(lr), nil
		case <-tick:
			if n := lr.bytes(); n > sent {
				sent = n
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n), Message: lr.last()})
			}
		case why := <-lost:
			if lr.isLaunched() {
				continue
			}
			lr.cancel(cancelByLaunch, 0)
			<-lr.done
			rec := lr.run.Record()
			what := "nothing was started (ledger: not_started)"
			if rec.Outcome != ledger.NotStarted {
				what = fmt.Sprintf("run %s was cancelled (ledger: %s %s)", rec.RunID, rec.State, rec.Outcome)
			}
			return nil, RunOut{}, fmt.Errorf("cannot reach %s (%s): %s; check the destination and its ssh login (keys, known_hosts, port), then call run again", lr.dest, why, what)
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), context.Canceled) {
				// The client is gone: --on-exit decides (Server.Close).
				return nil, RunOut{}, context.Cause(ctx)
			}
			// notifications/cancelled: a confirmed remote cancel before
			// the request is forgotten.
			lr.cancel(cancelByClient, 0)
			<-lr.done
			return s.finalOut(lr)
		}
	}
}

// finalOut is the result of a run Follow is done with. A run that was not
// started is an error naming why.
func (s *Server) finalOut(lr *liveRun) (*mcp.CallToolResult, RunOut, error) {
	out := s.liveOut(lr)
	if out.Outcome == ledger.NotStarted {
		return nil, RunOut{}, fmt.Errorf("run %s on %s was not started: %s", out.RunID, out.Dest, out.Reason)
	}
	return nil, out, nil
}

// liveOut is the result for a run this server started.
func (s *Server) liveOut(lr *liveRun) RunOut {
	rec := lr.run.Record()
	out := recordOut(&rec)
	out.State = recordState(rec, !lr.isDone())
	out.CancelledBy = lr.cancelledBy()
	out.Stdout = tailOf(lr.out)
	out.Stderr = tailOf(lr.errs)
	return out
}

func tailOf(st *stream) Tail {
	text, from := st.tail(tailBytes)
	return Tail{Text: text, From: from, Bytes: st.size()}
}

// recordOut is the result for a ledger record.
func recordOut(rec *ledger.Record) RunOut {
	out := RunOut{RunID: rec.RunID, Dest: rec.Dest, State: rec.State, LedgerState: rec.State,
		Outcome: rec.Outcome, ExitCode: rec.ExitCode, Cause: rec.Cause, Reason: rec.Reason,
		Stdout: Tail{From: rec.StdoutBytes, Bytes: rec.StdoutBytes}, Stderr: Tail{From: rec.StderrBytes, Bytes: rec.StderrBytes}}
	out.Confirmed = rec.State == ledger.Settled && (rec.Outcome == ledger.Completed || rec.Outcome == ledger.Cancelled)
	return out
}

// record reads a run this server does not follow from the ledger.
func (s *Server) record(ctx context.Context, id string) (*ledger.Record, error) {
	if id == "" {
		return nil, errors.New("run_id is empty; give the run_id that run returned (list names the ledger's runs)")
	}
	store, err := s.ledgerOrErr()
	if err != nil {
		return nil, err
	}
	rec, err := store.Read(ctx, id)
	if errors.Is(err, ledger.ErrNoRecord) || errors.Is(err, rundir.ErrBadID) {
		return nil, fmt.Errorf("no run %q in the ledger %s; list names the runs it holds", id, store)
	}
	if err != nil {
		return nil, fmt.Errorf("reading run %q from the ledger: %v", id, err)
	}
	return rec, nil
}

func (s *Server) toolLogs(ctx context.Context, _ *mcp.CallToolRequest, in LogsIn) (*mcp.CallToolResult, LogsOut, error) {
	if err := s.checkAllowed(""); err != nil {
		return nil, LogsOut{}, err
	}
	if in.Stream == "" {
		in.Stream = "stdout"
	}
	if in.Stream != "stdout" && in.Stream != "stderr" {
		return nil, LogsOut{}, fmt.Errorf("stream %q: want stdout or stderr", in.Stream)
	}
	if in.From < 0 {
		return nil, LogsOut{}, fmt.Errorf("from %d: an offset is 0 or more", in.From)
	}
	switch {
	case in.MaxBytes == 0:
		in.MaxBytes = defaultLogBytes
	case in.MaxBytes < 0 || in.MaxBytes > maxLogBytes:
		return nil, LogsOut{}, fmt.Errorf("max_bytes %d: want 1 to %d", in.MaxBytes, maxLogBytes)
	}
	lr := s.live(in.RunID)
	if lr == nil {
		rec, err := s.record(ctx, in.RunID)
		if err != nil {
			return nil, LogsOut{}, err
		}
		return nil, LogsOut{}, fmt.Errorf("run %s was not started by this server, which keeps only its own runs' output; %s", rec.RunID, hostLogsHint(rec))
	}
	st := lr.out
	if in.Stream == "stderr" {
		st = lr.errs
	}
	done := lr.isDone() // before the size: a done run's size is final
	b, err := st.read(in.From, in.MaxBytes)
	if err != nil {
		rec := lr.run.Record()
		return nil, LogsOut{}, fmt.Errorf("reading the run's %s: %v; %s", in.Stream, err, hostLogsHint(&rec))
	}
	out := LogsOut{RunID: lr.id(), Stream: in.Stream, From: in.From, Next: in.From + int64(len(b)), Size: st.size(), Encoding: "text"}
	if out.Next < in.From || in.From > out.Size {
		out.Next = in.From
	}
	if utf8.Valid(b) {
		out.Data = string(b)
	} else {
		out.Data, out.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	out.Done = done && out.Next >= out.Size
	return nil, out, nil
}

func (s *Server) toolCancel(ctx context.Context, _ *mcp.CallToolRequest, in CancelIn) (*mcp.CallToolResult, RunOut, error) {
	var grace float64
	if in.Grace != nil {
		if *in.Grace < 0 || math.IsNaN(*in.Grace) || *in.Grace > maxWait.Seconds() {
			return nil, RunOut{}, fmt.Errorf("grace %v: want seconds, 0 or more", *in.Grace)
		}
		grace = *in.Grace
	}
	lr := s.live(in.RunID)
	if lr == nil {
		if err := s.checkAllowed(""); err != nil {
			return nil, RunOut{}, err
		}
		rec, err := s.record(ctx, in.RunID)
		if err != nil {
			return nil, RunOut{}, err
		}
		out := recordOut(rec)
		if rec.State != ledger.Settled {
			// Not this server's to stop: only the controller that drives a
			// run cancels it (or the host's lease ends it).
			out.Outcome = ledger.Unknown
			out.Reason = fmt.Sprintf("run %s was not started by this server: cancel it where it was started (INT to its agent-wrap ssh), or on the host with 'ssh %s %s cancel %s'; 'agent-wrap settle %s' then records the outcome", rec.RunID, rec.Dest, rec.RemoteBin, rec.RunID, rec.RunID)
		}
		return nil, out, nil
	}
	if err := s.checkAllowed(lr.dest); err != nil {
		return nil, RunOut{}, err
	}
	lr.cancel(cancelByTool, grace)
	select {
	case <-lr.done:
	case <-ctx.Done():
		// The cancel goes on (it is in the ledger); this request is gone.
		return nil, RunOut{}, context.Cause(ctx)
	}
	return s.finalOut(lr)
}

func (s *Server) toolStatus(ctx context.Context, _ *mcp.CallToolRequest, in IDIn) (*mcp.CallToolResult, StatusOut, error) {
	if err := s.checkAllowed(""); err != nil {
		return nil, StatusOut{}, err
	}
	out := StatusOut{RunID: in.RunID}
	var rec *ledger.Record
	if lr := s.live(in.RunID); lr != nil {
		r := lr.run.Record()
		rec = &r
		out.Following = !lr.isDone()
	} else {
		r, err := s.record(ctx, in.RunID)
		if err != nil {
			return nil, StatusOut{}, err
		}
		rec = r
	}
	out.Ledger = asMap(rec)
	if !s.cfg.Allowed(rec.Dest) {
		out.HostError = fmt.Sprintf("destination %q is not allowed (--allow): the host was not asked", rec.Dest)
		return nil, out, nil
	}
	v, err := controller.HostVerdict(ctx, rec, s.logDir, verdictTimeout)
	if err != nil {
		out.HostError = err.Error()
	} else {
		out.Host = asMap(v)
	}
	return nil, out, nil
}

func (s *Server) toolList(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListOut, error) {
	if err := s.checkAllowed(""); err != nil {
		return nil, ListOut{}, err
	}
	store, err := s.ledgerOrErr()
	if err != nil {
		return nil, ListOut{}, err
	}
	recs, err := store.List(ctx, ledger.Filter{})
	if err != nil && len(recs) == 0 {
		return nil, ListOut{}, fmt.Errorf("listing the ledger %s: %v", store, err)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].CreatedAt.After(recs[j].CreatedAt) })
	out := ListOut{Ledger: store.String(), Runs: []ListEntry{}}
	if len(recs) > listMax {
		recs, out.Truncated = recs[:listMax], true
	}
	for _, r := range recs {
		e := ListEntry{RunID: r.RunID, Dest: r.Dest, State: r.State, Outcome: r.Outcome, ExitCode: r.ExitCode,
			Command: r.Command, CreatedAt: r.CreatedAt.Format(time.RFC3339)}
		if e.Command == nil {
			e.Command = []string{}
		}
		if lr := s.live(r.RunID); lr != nil && !lr.isDone() {
			e.Following, e.State = true, recordState(lr.run.Record(), true)
		}
		out.Runs = append(out.Runs, e)
	}
	return nil, out, nil
}

// asMap is v as JSON's object, for results that carry a record as it is.
func asMap(v any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return map[string]any{}
	}
	return m
}

// checkDest refuses a destination ssh would read as something else: empty,
// an option, or words.
func checkDest(dest string) error {
	switch {
	case dest == "":
		return errors.New("dest is empty; give the ssh destination, [user@]host")
	case strings.HasPrefix(dest, "-"):
		return fmt.Errorf("dest %q begins with '-', which ssh would read as an option; give [user@]host", dest)
	case strings.IndexFunc(dest, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("dest %q holds a space or a control character; give [user@]host", dest)
	}
	return nil
}

// commandOf is the argv to run: argv, or sh -c COMMAND.
func commandOf(in RunIn) ([]string, error) {
	var argv []string
	switch {
	case len(in.Argv) > 0 && in.Command != "":
		return nil, errors.New("both argv and command given; give one: argv for words passed as they are, command for a shell line")
	case len(in.Argv) > 0:
		if in.Argv[0] == "" {
			return nil, errors.New("argv[0] is empty; give the command to run first")
		}
		argv = in.Argv
	case strings.TrimSpace(in.Command) != "":
		argv = []string{"sh", "-c", in.Command}
	default:
		return nil, errors.New("no command: give argv (the command and its arguments) or command (a shell line)")
	}
	return argv, nil
}

// waitFor reads a wait in seconds: default 60, at most a day.
func waitFor(name string, v *float64) (time.Duration, error) {
	if v == nil {
		return defaultWait, nil
	}
	if *v < 0 || math.IsNaN(*v) || *v > maxWait.Seconds() {
		return 0, fmt.Errorf("%s %v: want seconds from 0 to %v", name, *v, maxWait.Seconds())
	}
	return time.Duration(*v * float64(time.Second)), nil
}

// durationArg reads a duration argument (durflag's reading), def when
// empty.
func durationArg(name, v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := durflag.Parse(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %v; nothing was started", name, v, err)
	}
	return d, nil
}
