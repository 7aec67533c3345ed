package controller

import (
	"github.com/agent-wrap/agent-wrap/controller/transport"
)

// What the controller's callers (the CLI, the MCP server, the tests and
// benchmarks) name of the transport, named here so that they need one
// package: see the transport package for each.

// Mux modes of Config.Mux.
const (
	MuxAuto = transport.MuxAuto // agent-wrap's own ControlMasters unless the user set a ControlPath (the default)
	MuxOff  = transport.MuxOff  // one connection per call, as the rsh makes it
)

// ErrMux is returned (wrapped) by Start when the masters' socket directory
// cannot be used, or Config.Mux is not a mode.
var ErrMux = transport.ErrMux

// MuxDir returns the default directory of the masters' sockets:
// $AGENT_WRAP_MUX_DIR, else $XDG_RUNTIME_DIR/agent-wrap-mux, else
// /tmp/agent-wrap-mux-UID.
func MuxDir(getenv func(string) string) string { return transport.MuxDir(getenv) }

// RecordedMaster is a ControlMaster as a controller recorded it in the mux
// directory (transport.RecordedMaster).
type RecordedMaster = transport.RecordedMaster

// RecordedMasters lists the masters recorded in dir that are alive and
// still the process recorded (transport.RecordedMasters).
func RecordedMasters(dir string) []RecordedMaster { return transport.RecordedMasters(dir) }

// Quote returns words as one POSIX shell line in which each word arrives
// as exactly one argument, byte for byte (transport.Quote).
func Quote(words ...string) string { return transport.Quote(words...) }

// SplitCommand splits an --rsh value into words as a POSIX shell would,
// without expanding anything (transport.SplitCommand).
func SplitCommand(s string) ([]string, error) { return transport.SplitCommand(s) }
