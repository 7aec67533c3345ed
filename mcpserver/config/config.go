// Package config is the command line of `agent-wrap mcp`: the flags and
// their checks, in one place for both binaries. agent-wrap reads it to give
// help and to refuse a bad command line before it execs agent-wrap-mcp;
// agent-wrap-mcp reads it to serve. It imports no MCP code: agent-wrap
// links it, and must not grow by the SDK.
package config

import (
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/internal/durflag"
	"github.com/spf13/pflag"
)

// On-exit policies: what becomes of the runs still live when the client
// goes away.
const (
	OnExitCancel = "cancel" // each is cancelled and the cancel confirmed (the default)
	OnExitKeep   = "keep"   // each is left to its lease
)

// Binary is the server's program, found beside agent-wrap, then on PATH.
const Binary = "agent-wrap-mcp"

// Config is one server's command line. Durations left unset are -1.
type Config struct {
	Allow      []string // shell globs on the destination; none: every call refused
	Ledger     string   // --ledger; "": the controller's default
	Lease      durflag.Value
	Grace      durflag.Value
	RenewEvery durflag.Value
	GiveUp     durflag.Value
	OnExit     string
	Rsh        string // "": $AGENT_WRAP_RSH, else ssh
	RemoteBin  string
	RemoteRoot string
	Mux        string
	Events     string
}

// Define adds the flags to fs, filling c.
func (c *Config) Define(fs *pflag.FlagSet) {
	fs.StringArrayVar(&c.Allow, "allow", nil, "allow runs on destinations matching `PATTERN`, a shell glob such as 'build@*.ci' (repeatable; with none, every call is refused)")
	fs.StringVar(&c.Ledger, "ledger", "", "the ledger: a `DIR`, or a postgres:// URL (default $AGENT_WRAP_LEDGER, else $XDG_STATE_HOME/agent-wrap/ledger, else ~/.local/state/agent-wrap/ledger)")
	c.Lease, c.Grace, c.RenewEvery, c.GiveUp = -1, -1, 0, 0
	fs.Var(&c.Lease, "lease", "each run's lease `D` unless the call gives one (default 5m; 0: no lease)")
	fs.Var(&c.Grace, "grace", "time `D` between TERM and KILL on the host (default 5s)")
	fs.Var(&c.RenewEvery, "renew-every", "renew each lease every `D` (default a third of the lease)")
	fs.Var(&c.GiveUp, "give-up", "stop trying to learn a run's outcome `D` after its last renewal that succeeded (default lease + grace + 30s)")
	for _, name := range []string{"lease", "grace", "renew-every", "give-up"} {
		fs.Lookup(name).DefValue = "" // the defaults are in the usage text
	}
	fs.StringVar(&c.OnExit, "on-exit", OnExitCancel, "`WHAT` becomes of this server's live runs when its client goes away: cancel (confirmed) or keep (left to their leases)")
	fs.StringVarP(&c.Rsh, "rsh", "e", "", "the ssh command `CMD`, split as a shell would (default $AGENT_WRAP_RSH, else ssh)")
	fs.StringVar(&c.RemoteBin, "remote-bin", "agent-wrap", "the agent-wrap `PATH` on the hosts")
	fs.StringVar(&c.RemoteRoot, "remote-root", "", "the run root `DIR` on the hosts (default: each host's own)")
	fs.StringVar(&c.Mux, "mux", controller.MuxAuto, "`MODE` auto: calls are sessions on agent-wrap's own ssh ControlMasters; off: a connection per call")
	fs.StringVar(&c.Events, "events", "", "append one JSON line per controller event of every run to `FILE`")
}

// Check refuses what Define's flags cannot: a policy, a mux mode or a
// pattern that is not one. The error names the flag.
func (c *Config) Check() error {
	if c.OnExit != OnExitCancel && c.OnExit != OnExitKeep {
		return fmt.Errorf("--on-exit %q: want %s or %s", c.OnExit, OnExitCancel, OnExitKeep)
	}
	if c.Mux != controller.MuxAuto && c.Mux != controller.MuxOff {
		return fmt.Errorf("--mux %q: want %s or %s", c.Mux, controller.MuxAuto, controller.MuxOff)
	}
	for _, p := range c.Allow {
		if p == "" {
			return errors.New("--allow \"\": an empty pattern allows nothing; give a destination or a glob such as 'user@host*'")
		}
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("--allow %q: not a shell glob (%v)", p, err)
		}
	}
	return nil
}

// Allowed reports whether dest matches one of the --allow patterns.
func (c *Config) Allowed(dest string) bool {
	for _, p := range c.Allow {
		if ok, _ := path.Match(p, dest); ok {
			return true
		}
	}
	return false
}

// Duration returns d, or def when d was not given (negative).
func Duration(d durflag.Value, def time.Duration) time.Duration {
	if d < 0 {
		return def
	}
	return time.Duration(d)
}
