package controller

// The controller's SSH agent, forwarded to a run (agent-wrap ssh --agent):
// the host's `run --agent MODE` scopes it to the run (docs/authority.md),
// and the launch connection is the one that forwards it. The wrapper's
// relay reaches the agent through the socket sshd made for that
// connection, so the agent answers the job while the launch connection
// lives; after a lost connection the reattach does not bring it back (see
// docs/controller.md).

import "github.com/agent-wrap/agent-wrap/controller/transport"

// Agent modes of Config.Agent: the values of the host's `run --agent`.
const (
	AgentScoped  = "scoped"  // forwarded, and relayed to the job only while the run is live and leased
	AgentInherit = "inherit" // forwarded, and the job gets sshd's socket as is
	AgentNone    = "none"    // not forwarded; the job has no agent
)

// ValidAgent reports whether mode is a Config.Agent: "" (nothing passed:
// the user's ssh configuration forwards or not, the host's run decides)
// or one of the modes.
func ValidAgent(mode string) bool {
	switch mode {
	case "", AgentScoped, AgentInherit, AgentNone:
		return true
	}
	return false
}

// agentFlags are the words of the host's run for the mode.
func (r *Run) agentFlags() []string {
	if r.cfg.Agent == "" {
		return nil
	}
	return []string{"--agent", r.cfg.Agent}
}

// launchHost is the host the launch connection goes through: with an
// agent mode and OpenSSH, one that forwards the controller's agent
// (scoped, inherit) or refuses to (none), whatever the user's ssh
// configuration says; otherwise the run's host as it is.
func (r *Run) launchHost() *transport.Host {
	opt := ""
	switch r.cfg.Agent {
	case AgentScoped, AgentInherit:
		// The agent of the controller's environment, named by its path:
		// forwarded even where the ssh configuration names another agent
		// for logging in (IdentityAgent), which a plain "yes" would follow.
		opt = "ForwardAgent=yes"
		if r.cfg.AgentSocket != "" {
			opt = "ForwardAgent=" + r.cfg.AgentSocket
		}
	case AgentNone:
		opt = "ForwardAgent=no"
	}
	if opt == "" || !transport.IsSSH(r.h.Rsh()) {
		return r.h
	}
	// Its own connection: a session on agent-wrap's masters would forward
	// the master's agent, if any, not this one.
	return r.h.OwnConnection("-o", opt)
}
