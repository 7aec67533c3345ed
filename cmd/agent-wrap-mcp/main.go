// As in agent-wrap: the runtime would re-read the cgroup's CPU quota once
// a second (Go 1.25's updatemaxprocs), a wakeup of an idle server for
// nothing; the quota is still read once, at start.

//go:debug updatemaxprocs=0

// Command agent-wrap-mcp is the Model Context Protocol server of
// agent-wrap on stdio: `agent-wrap mcp` execs it. It is a program of its
// own so that agent-wrap, which every run's wrapper is, does not carry the
// MCP SDK. See package mcpserver.
package main

import (
	"os"

	"github.com/agent-wrap/agent-wrap/mcpserver"
)

func main() {
	os.Exit(mcpserver.Main(os.Args[1:], os.Stdout, os.Stderr))
}
