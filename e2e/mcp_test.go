package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// agent-wrap mcp through the SDK's own Go client: the client starts
// `agent-wrap mcp` (which execs agent-wrap-mcp, built beside bin) and
// drives runs on the test's sshd. The host's /proc, its run records and
// the ledger are the judges, not the tool results alone.

var (
	mcpBuildOnce sync.Once
	mcpBuildErr  error
)

// buildMCP builds agent-wrap-mcp beside bin, once, where `agent-wrap mcp`
// looks for it first.
func buildMCP(t *testing.T) {
	t.Helper()
	mcpBuildOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(bin), "agent-wrap-mcp"), "./cmd/agent-wrap-mcp")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			mcpBuildErr = err
			t.Logf("building agent-wrap-mcp: %s", out)
		}
	})
	if mcpBuildErr != nil {
		t.Fatalf("building agent-wrap-mcp: %v", mcpBuildErr)
	}
}

// mcpArgs is `agent-wrap mcp` for the harness: its sshd allowed, its
// ledger, events and remote root, then extra.
func (c *ctlHarness) mcpArgs(extra ...string) []string {
	return append([]string{"mcp", "--allow", c.srv.Destination(), "--rsh", c.rsh(), "--remote-bin", bin,
		"--remote-root", c.root, "--ledger", c.ledger, "--events", c.events, "--lease", "120s", "--grace", "2s"}, extra...)
}

// mcpClient is one Go client with its server process.
type mcpClient struct {
	t        *testing.T
	cs       *mcp.ClientSession
	cmd      *exec.Cmd
	stderr   runtest.Buffer
	mu       sync.Mutex
	progress map[string][]float64 // by progress token
}

// connectMCP starts `agent-wrap args...` as an MCP server and connects
// the Go client to it. Cleanup closes the session and kills the server by
// its PID if it is still there.
func (c *ctlHarness) connectMCP(args ...string) *mcpClient {
	c.t.Helper()
	buildMCP(c.t)
	k := &mcpClient{t: c.t, progress: map[string][]float64{}}
	k.cmd = exec.Command(bin, args...)
	k.cmd.Env = append(append(os.Environ(), "AGENT_WRAP_MUX_DIR="+muxDirFor(c.t)), c.env...)
	k.cmd.Stderr = &k.stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "agent-wrap-e2e", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			k.mu.Lock()
			defer k.mu.Unlock()
			tok, _ := req.Params.ProgressToken.(string)
			k.progress[tok] = append(k.progress[tok], req.Params.Progress)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: k.cmd, TerminateDuration: waitLong}, nil)
	if err != nil {
		c.t.Fatalf("connecting to agent-wrap mcp: %v\nstderr: %s", err, k.stderr.String())
	}
	k.cs = cs
	c.t.Cleanup(func() {
		_ = cs.Close()
		if k.cmd.ProcessState == nil && k.cmd.Process != nil {
			_ = k.cmd.Process.Kill()
		}
	})
	return k
}

// call calls tool with args and returns its result; a protocol error fails
// the test.
func (k *mcpClient) call(ctx context.Context, tool string, args map[string]any, progressToken string) *mcp.CallToolResult {
	k.t.Helper()
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if progressToken != "" {
		p.SetProgressToken(progressToken)
	}
	res, err := k.cs.CallTool(ctx, p)
	if err != nil {
		k.t.Fatalf("%s %v: %v\nserver stderr: %s", tool, args, err, k.stderr.String())
	}
	return res
}

// callOK calls tool and decodes its structured result into out.
func (k *mcpClient) callOK(tool string, args map[string]any, out any) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLong)
	defer cancel()
	res := k.call(ctx, tool, args, "")
	if res.IsError {
		k.t.Fatalf("%s %v: isError: %s\nserver stderr: %s", tool, args, resultText(res), k.stderr.String())
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		k.t.Fatalf("%s: structured result %s: %v", tool, b, err)
	}
}

// callErr calls tool and wants a tool error whose text holds want.
func (k *mcpClient) callErr(tool string, args map[string]any, want string) string {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLong)
	defer cancel()
	res := k.call(ctx, tool, args, "")
	text := resultText(res)
	if !res.IsError || !strings.Contains(text, want) {
		k.t.Fatalf("%s %v: isError=%v %q; want an error saying %q", tool, args, res.IsError, text, want)
	}
	return text
}

func (k *mcpClient) progressOf(tok string) []float64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]float64(nil), k.progress[tok]...)
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// runOut is the part of a run result the tests judge.
type runOut struct {
	RunID       string `json:"run_id"`
	State       string `json:"state"`
	Outcome     string `json:"outcome"`
	ExitCode    *int   `json:"exit_code"`
	Cause       string `json:"cause"`
	CancelledBy string `json:"cancelled_by"`
	Confirmed   bool   `json:"confirmed"`
	Stdout      struct {
		Text  string `json:"text"`
		From  int64  `json:"from"`
		Bytes int64  `json:"bytes"`
	} `json:"stdout"`
}

func (r runOut) code() int {
	if r.ExitCode == nil {
		return -1
	}
	return *r.ExitCode
}

// ledgerIDs is the run IDs the ledger holds.
func (c *ctlHarness) ledgerIDs() []string {
	ents, _ := os.ReadDir(c.ledger)
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// hostRuns is the run directories under the host's root.
func (c *ctlHarness) hostRuns() []string {
	ents, _ := os.ReadDir(c.root)
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// TestMCPGoClient: the tools listed with schemas; a run that completes; the
// job's stdin; logs by offsets, byte for byte as the host's log; progress
// that increases; wait, status, list and cancel with a grace; a dest
// outside --allow and bad arguments refused with nothing recorded or
// started; an unknown run ID named.
func TestMCPGoClient(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.connectMCP(c.mcpArgs()...)
	dest := c.srv.Destination()

	// Tools, each with an input schema naming its arguments and an output
	// schema.
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	tools, err := k.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"run": {"dest", "argv", "command", "stdin", "wait_seconds", "lease"}, "wait": {"run_id", "seconds"},
		"logs": {"run_id", "stream", "from", "max_bytes"}, "cancel": {"run_id", "grace"}, "status": {"run_id"}, "list": nil}
	for _, tool := range tools.Tools {
		props, ok := want[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %q", tool.Name)
			continue
		}
		delete(want, tool.Name)
		in, _ := json.Marshal(tool.InputSchema)
		if !strings.Contains(string(in), `"type":"object"`) || tool.OutputSchema == nil || tool.Description == "" {
			t.Errorf("tool %s: input schema %s, output schema %v, description %q", tool.Name, in, tool.OutputSchema, tool.Description)
		}
		for _, p := range props {
			if !strings.Contains(string(in), `"`+p+`"`) {
				t.Errorf("tool %s: input schema lacks %q: %s", tool.Name, p, in)
			}
		}
	}
	if len(want) > 0 {
		t.Errorf("tools not listed: %v", want)
	}

	// Refusals: nothing recorded in the ledger, nothing on the host.
	k.callErr("run", map[string]any{"dest": "someone@elsewhere.invalid", "argv": []string{"touch", "/tmp/never"}}, "not allowed")
	k.callErr("run", map[string]any{"dest": dest, "argv": []string{"true"}, "command": "true"}, "both argv and command")
	k.callErr("run", map[string]any{"dest": dest}, "no command")
	k.callErr("run", map[string]any{"dest": "-oProxyCommand=touch /tmp/x", "argv": []string{"true"}}, "option")
	k.callErr("run", map[string]any{"dest": dest, "argv": []string{"true"}, "lease": "soon"}, "lease")
	k.callErr("run", map[string]any{"dest": dest, "argv": []string{"true"}, "run_id": "../x"}, "run_id")
	k.callErr("wait", map[string]any{"run_id": "no-such-run"}, "no run")
	if ids, runs := c.ledgerIDs(), c.hostRuns(); len(ids) != 0 || len(runs) != 0 {
		t.Fatalf("refused calls left ledger records %v and host runs %v", ids, runs)
	}

	// A run that completes, with stdin.
	var r runOut
	k.callOK("run", map[string]any{"dest": dest, "run_id": "done", "command": `cat; echo "to stderr" >&2; exit 3`, "stdin": "line one\nline two\n"}, &r)
	if r.State != "settled" || r.Outcome != "completed" || r.code() != 3 || r.Stdout.Text != "line one\nline two\n" || !r.Confirmed {
		t.Errorf("run: %+v; want settled completed 3 with stdin echoed", r)
	}
	c.wantSettled("done", "completed", "", 3)

	// stdin larger than a command line can carry, with a NUL byte, reaches
	// the job byte for byte through the controller's stdin pipe.
	big := strings.Repeat("0123456789abcdef\x00\n", 40000) // 720,000 bytes
	sum := sha256.Sum256([]byte(big))
	k.callOK("run", map[string]any{"dest": dest, "run_id": "bigin", "command": `sha256sum | cut -d' ' -f1`, "stdin": big}, &r)
	if want := hex.EncodeToString(sum[:]) + "\n"; r.Outcome != "completed" || r.code() != 0 || r.Stdout.Text != want {
		t.Errorf("bigin run: %+v; want completed 0 printing %q", r, want)
	}

	// logs by offsets: 300 KB of bytes that are not UTF-8, then text; the
	// pieces put together are the host's stdout.log byte for byte.
	k.callOK("run", map[string]any{"dest": dest, "run_id": "bytes", "command": `head -c 300000 /dev/urandom; echo; seq 1 20000`}, &r)
	if r.Outcome != "completed" || r.code() != 0 {
		t.Fatalf("bytes run: %+v", r)
	}
	host, err := os.ReadFile(filepath.Join(c.root, "bytes", "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for from, calls := int64(0), 0; ; calls++ {
		var l struct {
			Data, Encoding string
			Next, Size     int64
			Done           bool
		}
		k.callOK("logs", map[string]any{"run_id": "bytes", "from": from, "max_bytes": 70000}, &l)
		b := []byte(l.Data)
		if l.Encoding == "base64" {
			if b, err = base64.StdEncoding.DecodeString(l.Data); err != nil {
				t.Fatal(err)
			}
		}
		if l.Next != from+int64(len(b)) || l.Size != int64(len(host)) {
			t.Fatalf("logs from %d: next %d after %d bytes, size %d; host has %d", from, l.Next, len(b), l.Size, len(host))
		}
		got, from = append(got, b...), l.Next
		if l.Done {
			break
		}
		if calls > 100 {
			t.Fatal("logs never said done")
		}
	}
	if string(got) != string(host) {
		t.Errorf("logs put together: %d bytes, differing from the host's %d-byte stdout.log", len(got), len(host))
	}

	// Progress: increasing bytes, several notifications.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*waitLong)
	defer cancel2()
	res := k.call(ctx2, "run", map[string]any{"dest": dest, "run_id": "progress", "command": `for i in $(seq 1 25); do echo "step $i"; sleep 0.2; done`}, "tok-1")
	if res.IsError {
		t.Fatalf("progress run: %s", resultText(res))
	}
	p := k.progressOf("tok-1")
	if len(p) < 2 {
		t.Errorf("progress notifications: %v; want at least two", p)
	}
	for i := 1; i < len(p); i++ {
		if p[i] <= p[i-1] {
			t.Errorf("progress does not increase: %v", p)
		}
	}

	// wait, status and list on a run still going; then cancel with a
	// grace: confirmed, and its tree gone from the host's /proc.
	k.callOK("run", map[string]any{"dest": dest, "run_id": "long", "argv": sleepTree, "wait_seconds": 0}, &r)
	if r.State != "running" || r.RunID != "long" {
		t.Fatalf("run with wait_seconds 0: %+v; want running", r)
	}
	hr := c.waitRunning("long")
	waitMembers(t, hr.PGID, 3)
	k.callOK("wait", map[string]any{"run_id": "long", "seconds": 0.5}, &r)
	if r.State != "running" {
		t.Errorf("wait 0.5s: %+v; want running", r)
	}
	var st struct {
		Following bool
		Ledger    map[string]any
		Host      map[string]any
		HostError string `json:"host_error"`
	}
	k.callOK("status", map[string]any{"run_id": "long"}, &st)
	if !st.Following || st.Ledger["state"] != ledger.Running || st.Host["outcome"] != "running" {
		t.Errorf("status of a live run: %+v", st)
	}
	var ls struct {
		Runs []struct {
			RunID     string `json:"run_id"`
			Following bool
			State     string
		}
	}
	k.callOK("list", map[string]any{}, &ls)
	seen := map[string]bool{}
	for _, e := range ls.Runs {
		seen[e.RunID] = true
		if e.RunID == "long" && (!e.Following || e.State != "running") || e.RunID == "done" && e.Following {
			t.Errorf("list entry %+v", e)
		}
	}
	for _, id := range []string{"done", "bytes", "progress", "long"} {
		if !seen[id] {
			t.Errorf("list lacks %s: %+v", id, ls.Runs)
		}
	}
	start := time.Now()
	k.callOK("cancel", map[string]any{"run_id": "long", "grace": 1}, &r)
	t.Logf("cancel confirmed in %v", time.Since(start))
	if r.State != "settled" || r.Outcome != "cancelled" || r.code() != 143 || r.CancelledBy != "tool" || !r.Confirmed {
		t.Errorf("cancel: %+v; want settled cancelled 143 by tool, confirmed", r)
	}
	wantFinal(t, c.waitTerminal("long"), "cancelled", "cancel", 143)
	c.treeGone("long")
	c.wantSettled("long", "cancelled", "cancel", 143)
	if by := c.cancelBy("long"); by != "mcp:tool" {
		t.Errorf("the cancel_requested event says by %q, want mcp:tool", by)
	}
	k.callOK("status", map[string]any{"run_id": "long"}, &st)
	if st.Following || st.Host["outcome"] != "cancelled" {
		t.Errorf("status after the cancel: %+v", st)
	}
}

// wantCancelledAndSettled waits for run id's final record on the host,
// cancelled by a cancel (143), then checks its tree is gone and waits for
// the ledger to settle it the same.
func (c *ctlHarness) wantCancelledAndSettled(id string) {
	c.t.Helper()
	wantFinal(c.t, c.waitTerminal(id), "cancelled", "cancel", 143)
	c.treeGone(id)
	runtest.Eventually(c.t, "the ledger settled", func() bool { return c.ledgerRec(id).State == ledger.Settled })
	c.wantSettled(id, "cancelled", "cancel", 143)
}

// TestMCPAbortedCall: the client cancels its run request (ctx, which the Go
// client sends as notifications/cancelled): the run is cancelled on the
// host, its tree gone, its host record and ledger say cancelled, within
// seconds; with a ledger of files and one in PostgreSQL.
func TestMCPAbortedCall(t *testing.T) {
	eachLedger(t, testMCPAbortedCall)
}

func testMCPAbortedCall(t *testing.T, c *ctlHarness) {
	k := c.connectMCP(c.mcpArgs()...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := k.cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{
			"dest": c.srv.Destination(), "run_id": "abort", "argv": sleepTree, "wait_seconds": 600}})
		done <- res
	}()
	hr := c.waitRunning("abort")
	waitMembers(t, hr.PGID, 3)
	start := time.Now()
	cancel()
	<-done
	c.wantCancelledAndSettled("abort")
	took := time.Since(start)
	if r := c.ledgerRec("abort"); !r.CancelRequested {
		t.Errorf("ledger: cancel_requested not recorded: %+v", r)
	}
	if by := c.cancelBy("abort"); by != "mcp:client" {
		t.Errorf("the cancel_requested event says by %q, want mcp:client (the client's cancelled request)", by)
	}
	t.Logf("aborted call: tree gone and ledger settled %v after the abort", took)
	if took > waitLong {
		t.Errorf("the abort took %v to be confirmed", took)
	}
	var r runOut
	k.callOK("wait", map[string]any{"run_id": "abort", "seconds": 0}, &r)
	if r.Outcome != "cancelled" || r.CancelledBy != "client" {
		t.Errorf("wait after the abort: %+v; want cancelled by client", r)
	}

	// A wait request aborted is the same confirmed cancel of its run.
	k.callOK("run", map[string]any{"dest": c.srv.Destination(), "run_id": "abort-wait", "argv": sleepTree, "wait_seconds": 0}, &r)
	hw := c.waitRunning("abort-wait")
	waitMembers(t, hw.PGID, 3)
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() {
		p := &mcp.CallToolParams{Name: "wait", Arguments: map[string]any{"run_id": "abort-wait", "seconds": 600}}
		p.SetProgressToken("tok-wait")
		res, _ := k.cs.CallTool(ctx2, p)
		done <- res
	}()
	// The job has printed, so the server's first progress tick on the
	// wait reports it: then the request is in flight, and its abort is a
	// cancel of something.
	runtest.Eventually(t, "a progress notification of the wait", func() bool { return len(k.progressOf("tok-wait")) > 0 })
	cancel2()
	<-done
	c.wantCancelledAndSettled("abort-wait")
}

// TestMCPClientGone: two clients at once on one ledger, each with its own
// runs; one closes its stdin (goes away) with a run live: that run is
// cancelled and confirmed and its server exits, while the other client's
// run goes on and completes. --on-exit keep leaves a run to its lease.
func TestMCPClientGone(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	a := c.connectMCP(c.mcpArgs()...)
	b := c.connectMCP(c.mcpArgs()...)
	keep := c.connectMCP(c.mcpArgs("--on-exit", "keep")...)
	dest := c.srv.Destination()
	var r runOut
	a.callOK("run", map[string]any{"dest": dest, "run_id": "a-run", "argv": sleepTree, "wait_seconds": 0}, &r)
	b.callOK("run", map[string]any{"dest": dest, "run_id": "b-run", "command": "echo started; sleep 3; echo b done", "wait_seconds": 0}, &r)
	keep.callOK("run", map[string]any{"dest": dest, "run_id": "kept", "argv": sleepTree, "wait_seconds": 0, "lease": "600"}, &r)
	ha := c.waitRunning("a-run")
	waitMembers(t, ha.PGID, 3)
	hk := c.waitRunning("kept")
	c.waitRunning("b-run")

	// b does not see a's run as its own.
	var ls struct {
		Runs []struct {
			RunID     string `json:"run_id"`
			Following bool
		}
	}
	b.callOK("list", map[string]any{}, &ls)
	for _, e := range ls.Runs {
		if e.Following != (e.RunID == "b-run") {
			t.Errorf("b's list: %+v", e)
		}
	}

	// Nor may b stop it or read its output: they are a's.
	b.callErr("logs", map[string]any{"run_id": "a-run"}, "not started by this server")
	b.callOK("cancel", map[string]any{"run_id": "a-run"}, &r)
	if r.Outcome != "unknown" || r.Confirmed {
		t.Errorf("b's cancel of a's run: %+v; want unknown, naming where to cancel it", r)
	}
	if got := runtest.Members(ha.PGID); len(got) != 3 {
		t.Errorf("b's cancel touched a's run: %d live members, want 3", len(got))
	}

	serverPID := a.cmd.Process.Pid
	if err := a.cs.Close(); err != nil {
		t.Logf("closing a: %v", err)
	}
	wantFinal(t, c.waitTerminal("a-run"), "cancelled", "cancel", 143)
	c.treeGone("a-run")
	c.wantSettled("a-run", "cancelled", "cancel", 143)
	if by := c.cancelBy("a-run"); by != "mcp:exit" {
		t.Errorf("a-run's cancel_requested event says by %q, want mcp:exit (the client went away)", by)
	}
	runtest.Eventually(t, "a's server to exit", func() bool { return !proc.Alive(serverPID, 0) })

	b.callOK("wait", map[string]any{"run_id": "b-run", "seconds": 60}, &r)
	if r.Outcome != "completed" || r.code() != 0 || !strings.Contains(r.Stdout.Text, "b done") {
		t.Errorf("b's run after a went away: %+v", r)
	}

	// keep: the server exits, the run goes on under its lease.
	keepPID := keep.cmd.Process.Pid
	_ = keep.cs.Close()
	runtest.Eventually(t, "the keep server to exit", func() bool { return !proc.Alive(keepPID, 0) })
	if got := runtest.Members(hk.PGID); len(got) != 3 {
		t.Errorf("--on-exit keep: the kept run's group has %d live members, want 3", len(got))
	}
	if r, _ := c.status("kept"); r.State != "running" {
		t.Errorf("--on-exit keep: host record %v, want running", r)
	}
	if code, out := c.cancelHost("kept"); code != 0 {
		t.Errorf("cancelling the kept run on the host: exit %d: %s", code, out)
	}
	c.treeGone("kept")
}

// cancelBy is the "by" of run id's cancel_requested event in the events
// file: who asked the MCP server for the cancel.
func (c *ctlHarness) cancelBy(id string) string {
	b, _ := os.ReadFile(c.events)
	for _, line := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["run_id"] == id && m["event"] == "cancel_requested" {
			by, _ := m["by"].(string)
			return by
		}
	}
	return ""
}

// cancelHost cancels run id on the host over ssh, as a user would.
func (c *ctlHarness) cancelHost(id string) (int, string) {
	r := c.ssh("cancel", "--wait", "30s", id)
	return r.code, r.stdout + r.stderr
}

// TestMCPRefusals: without --allow every call is refused with the reason;
// an unopenable ledger is each call's error; without agent-wrap-mcp
// beside it or on PATH, agent-wrap mcp exits 127 naming how to install it.
func TestMCPRefusals(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.connectMCP("mcp", "--rsh", c.rsh(), "--remote-bin", bin, "--remote-root", c.root, "--ledger", c.ledger)
	k.callErr("run", map[string]any{"dest": c.srv.Destination(), "argv": []string{"true"}}, "--allow")
	k.callErr("list", map[string]any{}, "--allow")
	if runs := c.hostRuns(); len(runs) != 0 {
		t.Errorf("a refused run reached the host: %v", runs)
	}

	bad := filepath.Join(t.TempDir(), "ledger")
	if err := os.MkdirAll(bad, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(bad, 0o777)
	k2 := c.connectMCP("mcp", "--allow", "*", "--ledger", bad)
	k2.callErr("run", map[string]any{"dest": c.srv.Destination(), "argv": []string{"true"}}, "ledger")

	lone := t.TempDir()
	self, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lone, "agent-wrap"), self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(lone, "agent-wrap"), "mcp", "--allow", "*")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if code := exitCode(err); code != 127 || !strings.Contains(string(out), "agent-wrap-mcp") || !strings.Contains(string(out), "hint:") {
		t.Errorf("agent-wrap mcp without agent-wrap-mcp: exit %d, %q; want 127 naming it", code, out)
	}
	cmd = exec.Command(bin, "mcp", "--on-exit", "later")
	out, err = cmd.CombinedOutput()
	if code := exitCode(err); code != 64 || !strings.Contains(string(out), "--on-exit") {
		t.Errorf("agent-wrap mcp --on-exit later: exit %d, %q; want 64", code, out)
	}
}

// TestMCPUnreachableAndSignalled: a host that cannot be reached is a tool
// error naming it, the run settled not_started and nothing on the host;
// TERM to the server ends its session as the client's going away does:
// its live run cancelled and confirmed, then it exits.
func TestMCPUnreachableAndSignalled(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.connectMCP(c.mcpArgs()...)
	dest := c.srv.Destination()

	closed := c.connectMCP("mcp", "--allow", "*", "--rsh", "ssh -o BatchMode=yes -o ConnectTimeout=10 -p 1", "--remote-bin", bin,
		"--remote-root", c.root, "--ledger", c.ledger, "--mux", "off")
	closed.callErr("run", map[string]any{"dest": "nobody@127.0.0.1", "run_id": "unreachable", "argv": []string{"true"}}, "127.0.0.1")
	if r := c.ledgerRec("unreachable"); r.State != ledger.Settled || r.Outcome != ledger.NotStarted {
		t.Errorf("ledger of the unreachable run: state %s outcome %s reason %q; want settled not_started", r.State, r.Outcome, r.Reason)
	}
	if runs := c.hostRuns(); len(runs) != 0 {
		t.Errorf("host runs after an unreachable launch: %v", runs)
	}

	var r runOut
	k.callOK("run", map[string]any{"dest": dest, "run_id": "termed", "argv": sleepTree, "wait_seconds": 0}, &r)
	hr := c.waitRunning("termed")
	waitMembers(t, hr.PGID, 3)
	pid := k.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.wantCancelledAndSettled("termed")
	runtest.Eventually(t, "the server to exit", func() bool { return !proc.Alive(pid, 0) })
}

// mcpClientEnv makes the test binary a Go MCP client of its own process
// (init below), so that a test can SIGKILL a client: the variable holds
// the server's argv and the run call's arguments, as JSON.
const mcpClientEnv = "AGENT_WRAP_E2E_MCP_CLIENT"

func init() {
	spec := os.Getenv(mcpClientEnv)
	if spec == "" {
		return
	}
	// Not for the server's children: its ssh's ProxyCommand is this test
	// binary too, as the relay's connector.
	os.Unsetenv(mcpClientEnv)
	os.Exit(mcpHelperClient(spec))
}

// mcpHelperClient connects to the server, starts the run, prints its
// result on a line, then waits for its own stdin to end (it is killed
// before that).
func mcpHelperClient(spec string) int {
	var s struct {
		Server []string       `json:"server"`
		Run    map[string]any `json:"run"`
	}
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return 2
	}
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "agent-wrap-e2e-helper", Version: "1"}, nil)
	cmd := exec.Command(s.Server[0], s.Server[1:]...)
	cmd.Stderr = os.Stderr
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		os.Stderr.WriteString("helper client: " + err.Error() + "\n")
		return 1
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: s.Run})
	if err != nil || res.IsError {
		os.Stderr.WriteString("helper client: run failed\n")
		return 1
	}
	b, _ := json.Marshal(res.StructuredContent)
	os.Stdout.Write(append(b, '\n'))
	buf := make([]byte, 1)
	os.Stdin.Read(buf) // the test kills this process meanwhile
	return 0
}

// TestMCPGoClientKilled: a Go client SIGKILLed with a run live: its server
// sees its stdin end, cancels the run (confirmed) and exits.
func TestMCPGoClientKilled(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	buildMCP(t)
	spec, _ := json.Marshal(map[string]any{
		"server": append([]string{bin}, c.mcpArgs()...),
		"run":    map[string]any{"dest": c.srv.Destination(), "run_id": "go-killed", "argv": sleepTree, "wait_seconds": 0},
	})
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), mcpClientEnv+"="+string(spec), "AGENT_WRAP_MUX_DIR="+muxDirFor(t))
	var errb runtest.Buffer
	helper.Stderr = &errb
	in, _ := helper.StdinPipe()
	out, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		if helper.ProcessState == nil {
			_ = helper.Process.Kill()
			_ = helper.Wait()
		}
	})
	line := make(chan string, 1)
	go func() {
		b := make([]byte, 64<<10)
		n, _ := out.Read(b)
		line <- string(b[:n])
	}()
	select {
	case l := <-line:
		if !strings.Contains(l, `"run_id":"go-killed"`) {
			t.Fatalf("helper client: %q\nstderr: %s", l, errb.String())
		}
	case <-time.After(3 * waitLong):
		t.Fatalf("helper client never started its run\nstderr: %s", errb.String())
	}
	hr := c.waitRunning("go-killed")
	waitMembers(t, hr.PGID, 3)
	serverPID := c.ledgerRec("go-killed").ControllerPID
	if !proc.Alive(serverPID, 0) {
		t.Fatalf("the ledger's controller_pid %d is not a live server", serverPID)
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	c.wantCancelledAndSettled("go-killed")
	runtest.Eventually(t, "the server to exit", func() bool { return !proc.Alive(serverPID, 0) })
}

// TestMCPParentGone: the client's process gone while its pipe to the
// server's stdin is still held elsewhere (here by the test): the server
// sees its parent exit (a pidfd), cancels its live run, confirmed, and
// exits.
func TestMCPParentGone(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	buildMCP(t)
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inW.Close()
	// The parent: a shell that starts the server with the test's pipe as
	// its stdin and waits; the test speaks MCP over the pipes directly.
	// (An asynchronous command's stdin is /dev/null unless redirected, and
	// dash applies that first: the pipe goes by fd 3.)
	parent := exec.Command("sh", append([]string{"-c", `exec 3<&0; "$@" <&3 3<&- & wait`, "sh", bin}, c.mcpArgs()...)...)
	parent.Env = append(os.Environ(), "AGENT_WRAP_MUX_DIR="+muxDirFor(t))
	parent.Stdin = inR
	var errb runtest.Buffer
	parent.Stderr = &errb
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	t.Cleanup(func() {
		if parent.ProcessState == nil {
			_ = parent.Process.Kill()
			_ = parent.Wait()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLong)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent-wrap-e2e", Version: "1"}, nil).
		Connect(ctx, &mcp.IOTransport{Reader: out, Writer: inW}, nil)
	if err != nil {
		t.Fatalf("connecting: %v\nstderr: %s", err, errb.String())
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{
		"dest": c.srv.Destination(), "run_id": "orphaned", "argv": sleepTree, "wait_seconds": 0}})
	if err != nil || res.IsError {
		t.Fatalf("run: %v %v\nstderr: %s", err, res, errb.String())
	}
	hr := c.waitRunning("orphaned")
	waitMembers(t, hr.PGID, 3)
	serverPID := c.ledgerRec("orphaned").ControllerPID
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	c.wantCancelledAndSettled("orphaned")
	if by := c.cancelBy("orphaned"); by != "mcp:exit" {
		t.Errorf("cancel_requested by %q, want mcp:exit", by)
	}
	runtest.Eventually(t, "the server to exit", func() bool { return !proc.Alive(serverPID, 0) })
	if !strings.Contains(errb.String(), "the client's process is gone") {
		t.Errorf("the server did not say why it ended: %s", errb.String())
	}
}
