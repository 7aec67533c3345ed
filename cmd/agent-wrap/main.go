// The runtime re-reads the CPU quota of its cgroup once a second to adjust
// GOMAXPROCS (Go 1.25's updatemaxprocs). A wrapper lives as long as its job,
// hundreds of them at once on a host, and needs no more than one processor:
// that read would be one of the few things an idle wrapper wakes for. The
// quota is still read once, at start (containermaxprocs).

//go:debug updatemaxprocs=0

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
