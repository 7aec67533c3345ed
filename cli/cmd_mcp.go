package cli

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/mcpserver/config"
)

func init() {
	register(&command{
		name:     "mcp",
		summary:  "serve agent-wrap ssh to an AI agent as Model Context Protocol tools on stdio",
		synopsis: "mcp --allow PATTERN... [FLAGS]",
		help:     mcpHelp,
		exits:    "0 the client went away (its live runs cancelled and confirmed, or kept with --on-exit keep); 64 usage; 126 agent-wrap-mcp could not be executed; 127 agent-wrap-mcp is not installed beside agent-wrap or on PATH",
		run:      runMCP,
	})
}

const mcpHelp = `mcp is a Model Context Protocol server on stdin and stdout for an AI agent:
the tools run, wait, logs, cancel, status and list, each run a controller
run as 'agent-wrap ssh' makes it (ledger record before the first
connection, renewals, reattach by byte offsets, settled outcome). A
request the client cancels (notifications/cancelled) is a confirmed remote
cancel of its run; when the client goes away, every live run this server
started is cancelled and the cancel confirmed (--on-exit keep: left to its
lease), then the server exits. A destination must match an --allow
pattern. The server is the program agent-wrap-mcp, installed beside
agent-wrap; this command execs it. See docs/reference.md.
`

func runMCP(e *Env, args []string) int {
	fs := e.flags("mcp")
	_ = fs.MarkHidden("root") // the run root is the host's: --remote-root
	var c config.Config
	c.Define(fs)
	oneOf(fs, "on-exit", config.OnExitCancel, config.OnExitKeep)
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return e.usageError("mcp takes no arguments, only flags (%q)", fs.Arg(0))
	}
	if err := c.Check(); err != nil {
		return e.usageError("mcp: %v", err)
	}
	prog, err := mcpBinary()
	if err != nil {
		e.errorf("mcp: %v", err)
		e.hint("install %s beside agent-wrap: the agent-wrap package ships it, 'make build' builds it into bin/, or go install ./cmd/%s", config.Binary, config.Binary)
		return exitcode.NotFound
	}
	err = syscall.Exec(prog, append([]string{prog}, args...), os.Environ())
	e.errorf("mcp: exec %s: %v", prog, err)
	return exitcode.NotExecutable
}

// mcpBinary finds agent-wrap-mcp beside this executable, else on PATH.
func mcpBinary() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), config.Binary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath(config.Binary)
	if err != nil {
		return "", errors.New(config.Binary + " is not installed: not beside agent-wrap, nor on PATH")
	}
	return filepath.Abs(p)
}
