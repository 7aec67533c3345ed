// Command agent-wrap runs one job in its own session under a renewable lease,
// records everything needed to stop and judge it later, and stops its whole
// process tree on cancel, lease expiry or a signal. See README.md.
package main

import (
	"context"
	"os"

	"github.com/agent-wrap/agent-wrap/cli"
	_ "github.com/agent-wrap/agent-wrap/internal/bigstack" // first: one stack growth instead of many
)

func main() {
	e := &cli.Env{Ctx: context.Background(), Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Exits: true}
	os.Exit(e.Run(os.Args[1:]))
}
