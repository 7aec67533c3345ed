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
