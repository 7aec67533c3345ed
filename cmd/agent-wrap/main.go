// Command agent-wrap runs one job in its own session under a renewable lease,
// records everything needed to stop and judge it later, and stops its whole
// process tree on cancel, lease expiry or a signal. See README.md.
package main

import (
	"context"
	"os"

	"github.com/agent-wrap/agent-wrap/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
