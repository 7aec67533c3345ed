package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// agent-wrap mcp through the official TypeScript client
// (testdata/mcpclient/client.mjs on @modelcontextprotocol/sdk, which
// .ci/deps installs outside the tree): the tools listed, a run that
// completes, progress, an AbortController's abort confirmed on the host,
// and the client SIGKILLed with a run live.

// tsClient is one node process running client.mjs.
type tsClient struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	mu      sync.Mutex
	answers map[string]chan map[string]any // by call ID; "list", "ready"
	stderr  runtest.Buffer
}

// npmCache is where .ci/deps installs the TypeScript SDK.
func npmCache() string {
	if d := os.Getenv("AGENT_WRAP_NPM_CACHE"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "agent-wrap-test", "npm")
}

func (c *ctlHarness) startTS(args ...string) *tsClient {
	c.t.Helper()
	buildMCP(c.t)
	node, err := exec.LookPath("node")
	sdk := npmCache()
	if _, serr := os.Stat(filepath.Join(sdk, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil || serr != nil {
		c.t.Fatalf("the TypeScript MCP client is not installed (node: %v; SDK in %s: %v); run .ci/deps, which installs node and @modelcontextprotocol/sdk there", err, sdk, serr)
	}
	server, _ := json.Marshal(append([]string{bin}, args...))
	script, _ := filepath.Abs(filepath.Join("testdata", "mcpclient", "client.mjs"))
	k := &tsClient{t: c.t, answers: map[string]chan map[string]any{"ready": make(chan map[string]any, 1), "list": make(chan map[string]any, 1)}}
	k.cmd = exec.Command(node, script)
	k.cmd.Env = append(append(os.Environ(), "MCP_SDK_DIR="+sdk, "MCP_SERVER="+string(server), "AGENT_WRAP_MUX_DIR="+muxDirFor(c.t)), c.env...)
	k.cmd.Stderr = &k.stderr
	k.in, _ = k.cmd.StdinPipe()
	out, _ := k.cmd.StdoutPipe()
	if err := k.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			key, _ := m["op"].(string)
			if key == "call" {
				key, _ = m["id"].(string)
			}
			k.answer(key) <- m
		}
		close(done)
	}()
	c.t.Cleanup(func() {
		k.in.Close()
		if k.cmd.ProcessState == nil {
			_ = k.cmd.Process.Kill()
		}
		<-done
		_ = k.cmd.Wait()
	})
	k.await("ready")
	return k
}

func (k *tsClient) answer(key string) chan map[string]any {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, ok := k.answers[key]
	if !ok {
		ch = make(chan map[string]any, 1)
		k.answers[key] = ch
	}
	return ch
}

func (k *tsClient) send(m map[string]any) {
	k.t.Helper()
	b, _ := json.Marshal(m)
	if _, err := k.in.Write(append(b, '\n')); err != nil {
		k.t.Fatalf("writing to the TypeScript client: %v\nstderr: %s", err, k.stderr.String())
	}
}

// await waits for the answer keyed key.
func (k *tsClient) await(key string) map[string]any {
	k.t.Helper()
	select {
	case m := <-k.answer(key):
		return m
	case <-time.After(3 * waitLong):
		k.t.Fatalf("no answer %q from the TypeScript client\nstderr: %s", key, k.stderr.String())
	}
	return nil
}

// callAsync starts a call; await(id) has its answer.
func (k *tsClient) callAsync(id, tool string, args map[string]any, progress bool) {
	k.answer(id)
	k.send(map[string]any{"op": "call", "id": id, "tool": tool, "args": args, "progress": progress})
}

// structured returns a call answer's structured result, failing on an
// error or isError.
func structured(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	res, _ := m["result"].(map[string]any)
	if res == nil || res["isError"] == true {
		t.Fatalf("call %v: %v", m["id"], m)
	}
	sc, _ := res["structuredContent"].(map[string]any)
	return sc
}

func TestMCPTypeScriptClient(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.startTS(c.mcpArgs()...)
	dest := c.srv.Destination()

	k.send(map[string]any{"op": "list"})
	tools, _ := k.await("list")["tools"].([]any)
	names := map[string]bool{}
	for _, x := range tools {
		tool := x.(map[string]any)
		names[tool["name"].(string)] = true
		in, _ := tool["inputSchema"].(map[string]any)
		if in["type"] != "object" || tool["outputSchema"] == nil {
			t.Errorf("tool %v: inputSchema %v outputSchema %v", tool["name"], in, tool["outputSchema"])
		}
	}
	for _, n := range []string{"run", "wait", "logs", "cancel", "status", "list"} {
		if !names[n] {
			t.Errorf("the TypeScript client does not see tool %q: %v", n, names)
		}
	}

	// A run that completes, with progress that increases.
	k.callAsync("c1", "run", map[string]any{"dest": dest, "run_id": "ts-done", "command": `for i in $(seq 1 20); do echo "line $i"; sleep 0.2; done; exit 5`}, true)
	a := k.await("c1")
	r := structured(t, a)
	if r["state"] != "settled" || r["outcome"] != "completed" || r["exit_code"] != float64(5) {
		t.Errorf("ts run: %v", r)
	}
	if out, _ := r["stdout"].(map[string]any); !strings.HasSuffix(fmt.Sprint(out["text"]), "line 20\n") {
		t.Errorf("ts run stdout: %v", out)
	}
	prog, _ := a["progress"].([]any)
	if len(prog) < 2 {
		t.Errorf("progress: %v; want at least two notifications", prog)
	}
	for i := 1; i < len(prog); i++ {
		if prog[i].(float64) <= prog[i-1].(float64) {
			t.Errorf("progress does not increase: %v", prog)
		}
	}
	c.wantSettled("ts-done", "completed", "", 5)

	// The AbortController's abort: a confirmed remote cancel.
	k.callAsync("c2", "run", map[string]any{"dest": dest, "run_id": "ts-abort", "argv": sleepTree, "wait_seconds": 600}, false)
	hr := c.waitRunning("ts-abort")
	waitMembers(t, hr.PGID, 3)
	start := time.Now()
	k.send(map[string]any{"op": "abort", "id": "c2"})
	if e, _ := k.await("c2")["error"].(string); e == "" {
		t.Errorf("the aborted call did not fail on the client")
	}
	c.wantCancelledAndSettled("ts-abort")
	t.Logf("abort confirmed on the host and in the ledger %v after it", time.Since(start))

	// The client SIGKILLed with a run live: the server sees its stdin end,
	// cancels the run (confirmed) and exits.
	k.callAsync("c3", "run", map[string]any{"dest": dest, "run_id": "ts-killed", "argv": sleepTree, "wait_seconds": 0}, false)
	structured(t, k.await("c3"))
	hk := c.waitRunning("ts-killed")
	waitMembers(t, hk.PGID, 3)
	serverPID := c.ledgerRec("ts-killed").ControllerPID
	if !proc.Alive(serverPID, 0) {
		t.Fatalf("the ledger's controller_pid %d is not a live server", serverPID)
	}
	if err := k.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.wantCancelledAndSettled("ts-killed")
	runtest.Eventually(t, "the server to exit", func() bool { return !proc.Alive(serverPID, 0) })
}
