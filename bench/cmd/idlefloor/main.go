// The runtime re-reads the CPU quota once a second unless told not to;
// agent-wrap tells it not to (cmd/agent-wrap), and so does its floor.

//go:debug updatemaxprocs=0

// Command idlefloor is the memory floor of an idle wrapper: a program that
// links what agent-wrap links (package cli and everything below it), starts
// as agent-wrap does (bigstack first), subscribes to the wrapper's five
// signals and then does nothing until a TERM or INT. What it keeps private
// (RssAnon) is the Go runtime's and the package inits' own: no change to
// the wrapper goes below it. The idlescale figure of `make bench` reports it
// beside the wrappers', started with GOMAXPROCS=1 as `run --detach` starts
// its supervisor.
//
//	idlefloor
package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"

	_ "github.com/agent-wrap/agent-wrap/cli" // linked, as in agent-wrap; its inits run
	_ "github.com/agent-wrap/agent-wrap/internal/bigstack"
)

func main() {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGCHLD, unix.SIGPIPE)
	for sig := range sigs {
		if sig == unix.SIGTERM || sig == unix.SIGINT {
			return
		}
	}
}
