package mcpserver

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/mcpserver/config"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/pflag"
)

// Main is agent-wrap-mcp: parse the command line, serve one client on
// stdin and stdout until it goes away (or INT, TERM or HUP arrives), end
// the runs as --on-exit says, and return the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet(config.Binary, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config.Config
	c.Define(fs)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "usage: %s --allow PATTERN... [FLAGS]\n\nA Model Context Protocol server on stdio: agent-wrap ssh as tools (run, wait, logs, cancel, status, list). 'agent-wrap mcp' execs it; see 'agent-wrap help mcp'.\n\nflags:\n%s", config.Binary, fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return exitcode.OK
		}
		fmt.Fprintf(stderr, "%s: %v\n%s: hint: see 'agent-wrap help mcp'\n", config.Binary, err, config.Binary)
		return exitcode.Usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: takes no arguments, only flags (%q)\n%s: hint: see 'agent-wrap help mcp'\n", config.Binary, fs.Arg(0), config.Binary)
		return exitcode.Usage
	}
	// INT, TERM and HUP end the session as the client's going away does;
	// a client gone makes writes to stdout fail with EPIPE, which must not
	// kill the server before its runs are ended.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer signal.Stop(sigs)

	s, err := New(c, os.Getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n%s: hint: see 'agent-wrap help mcp'\n", config.Binary, err, config.Binary)
		return exitcode.Usage
	}
	if len(c.Allow) == 0 {
		s.notice("no --allow given: every call will be refused; restart with --allow PATTERN")
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	watchParent(func() {
		s.notice("the client's process is gone: ending the session")
		stop()
	})
	go func() {
		for sig := range sigs {
			if sig != syscall.SIGPIPE {
				s.notice(fmt.Sprintf("%v: ending the session", sig))
				stop()
			}
		}
	}()
	err = s.Serve(ctx, &mcp.StdioTransport{})
	s.Close()
	if err != nil && ctx.Err() == nil {
		s.notice(fmt.Sprintf("session ended: %v", err))
	}
	return exitcode.OK
}
