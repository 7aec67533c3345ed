package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpFigure: `agent-wrap mcp` (agent-wrap-mcp, built beside the measured
// agent-wrap by make build) through the SDK's Go client, against a
// throwaway sshd on 127.0.0.1 and one shared ControlMaster:
//   - the `run` tool for `true`, waited for to its settled outcome, against
//     `agent-wrap ssh DEST -- true`, interleaved in one run: the ratio is
//     what the protocol and the server add to the same controller;
//   - the server's own CPU (utime+stime of its process, ssh clients apart)
//     over a window with ten runs in flight, each renewing its lease:
//     what an agent's idle server costs.
func (r *runner) mcpFigure() (err error) {
	defer catchFatal(&err)
	server := filepath.Join(filepath.Dir(r.bin), "agent-wrap-mcp")
	if _, err := os.Stat(server); err != nil {
		return fmt.Errorf("agent-wrap-mcp is not beside %s (make build builds both): %v", r.bin, err)
	}
	g, err := r.sshRig("mcp", "mcp-cm")
	if err != nil {
		return err
	}
	root, rsh, dest := g.root, g.rsh, g.srv.Destination()
	ledgerDir := filepath.Join(r.scratch, "mcp-ledger")
	cmd := exec.Command(r.bin, "mcp", "--allow", dest, "--rsh", rsh, "--remote-bin", r.bin, "--remote-root", root,
		"--ledger", ledgerDir, "--lease", "60s", "--grace", "2s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	client := mcp.NewClient(&mcp.Implementation{Name: "awbench", Version: "1"}, nil)
	ctx := context.Background()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
	if err != nil {
		return fmt.Errorf("connecting to agent-wrap mcp: %v", err)
	}
	r.killGroupAtCleanup(cmd)
	defer cs.Close()
	call := func(args map[string]any) (map[string]any, error) {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: args})
		if err != nil {
			return nil, err
		}
		var out map[string]any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
		if res.IsError {
			return nil, fmt.Errorf("run %v: isError: %s", args, b)
		}
		return out, nil
	}

	// 1. run `true` through MCP against agent-wrap ssh.
	viaMCP := func() (float64, error) {
		t0 := bench.Now()
		out, err := call(map[string]any{"dest": dest, "run_id": r.id("mcp"), "argv": []string{"true"}})
		d := bench.Since(t0)
		if err != nil {
			return 0, err
		}
		if out["outcome"] != "completed" {
			return 0, fmt.Errorf("mcp run of true: %v", out)
		}
		return d, nil
	}
	viaSSH := func() (float64, error) { return timeCmd(g.ctl(ledgerDir, r.id("ssh"), "true")) }
	s, err := bench.Interleave(2, r.n(30, 8), viaMCP, viaSSH)
	if err != nil {
		return err
	}
	a, b := bench.Median(s[0]), bench.Median(s[1])
	r.msReport("mcp `run` of `true`", a, b, "agent-wrap ssh DEST -- true", 2)
	r.detail("mcp: the run tool for `true`, waited for to its settled outcome, through the SDK's Go client: %s; `agent-wrap ssh DEST -- true`: %s (one shared ControlMaster, interleaved; the server is already up, while each agent-wrap ssh pays its own start and ledger open, so the ratio can be under 1)",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms))

	// 2. The server's CPU with ten runs in flight.
	var ids []string
	for i := 0; i < 10; i++ {
		id := r.id("mcp-idle")
		if _, err := call(map[string]any{"dest": dest, "run_id": id, "argv": []string{"sleep", "600"}, "wait_seconds": 0}); err != nil {
			return err
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if err := bench.WaitUntil(time.Minute, 20*time.Millisecond, func() (bool, error) {
			rec, err := readRecord(root, id)
			return err == nil && rec.State == "running", nil
		}); err != nil {
			return fmt.Errorf("run %s never running: %v", id, err)
		}
	}
	pid := cmd.Process.Pid // agent-wrap exec'd agent-wrap-mcp: the same process
	window := time.Duration(r.n(20, 6)) * time.Second
	t0, ok0 := cpuTicks(pid)
	w0 := time.Now()
	time.Sleep(window) // the measurement window, not synchronisation
	t1, ok1 := cpuTicks(pid)
	el := time.Since(w0).Seconds()
	if !ok0 || !ok1 {
		return fmt.Errorf("agent-wrap-mcp (pid %d): cannot read its CPU time", pid)
	}
	cpu := float64(t1-t0) / 100 / el // USER_HZ
	r.rows = append(r.rows, row{
		figure:   "mcp server idle CPU, ten runs in flight",
		measured: fmt.Sprintf("%.2f%% of a CPU", cpu*100), baseline: "-",
		ratio: "-", target: "report", limit: "-", pass: "n/a",
	})
	r.detail("mcp: agent-wrap-mcp's own CPU over %.0f s with ten `sleep 600` runs in flight (leases 60 s, renewed every 20 s in one batch per destination): %d ticks, %.2f%% of a CPU",
		el, t1-t0, cpu*100)

	// The client goes away: the server cancels the ten, confirmed, and exits.
	cs.Close()
	for _, id := range ids {
		rec, err := readRecord(root, id)
		if err != nil {
			return err
		}
		if rec.State != "cancelled" {
			return fmt.Errorf("run %s after the client went away: %s, want cancelled", id, rec.State)
		}
		if n := liveMembers(rec.PGID); n != 0 {
			return fmt.Errorf("run %s: %d members of group %d alive after the server exited", id, n, rec.PGID)
		}
	}
	return nil
}
