package wrapper

// This file: the authority a run holds, scoped to the run (CONTRACT,
// "Authority ends with the run"). The job's environment gets
// AGENT_WRAP_RUN_ID and SSH_AUTH_SOCK as Config.Agent says; with
// AgentScoped the wrapper listens on a relay (agentrelay) before the job
// starts, decides each request with authority.Gate, and revokes the relay
// at the intent, before the first signal.

import (
	"os"
	"strings"
	"sync"

	"github.com/agent-wrap/agent-wrap/agentrelay"
	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Agent modes for Config.Agent.
const (
	AgentScoped  = "scoped"  // a relay of the run's own, revoked with the run
	AgentInherit = "inherit" // SSH_AUTH_SOCK passed on untouched
	AgentNone    = "none"    // SSH_AUTH_SOCK removed
)

// Environment variables the job's environment is built with.
const (
	envRunID    = "AGENT_WRAP_RUN_ID"
	envAuthSock = "SSH_AUTH_SOCK"
)

// agentMode resolves a requested mode against the wrapper's own
// SSH_AUTH_SOCK: "" is AgentScoped when there is an agent and AgentNone
// when there is not; with no agent there is nothing to scope or pass on, so
// every mode is AgentNone.
func agentMode(mode, upstream string) string {
	if upstream == "" {
		return AgentNone
	}
	if mode == "" {
		return AgentScoped
	}
	return mode
}

// scope is the run's relay and what the per-request check waits for.
type scope struct {
	mode     string
	upstream string
	relay    *agentrelay.Relay
	gate     authority.Gate // decides each request

	live     chan struct{} // closed once the run is recorded running, or will never be
	liveOnce sync.Once
}

// startAuthority resolves the agent mode and, for AgentScoped, listens on
// the run's relay. It runs after the claim and before the job starts, so
// the job's environment can name the socket.
func (s *supervisor) startAuthority() error {
	upstream := os.Getenv(envAuthSock)
	s.scope = &scope{mode: agentMode(s.cfg.Agent, upstream), upstream: upstream, live: make(chan struct{})}
	s.scope.gate = authority.Gate{
		Dir: s.d,
		Member: func(_ *statusfile.Record, pid int, start uint64) bool {
			_, err := s.contains(pid, start)
			return err == nil
		},
		// The wrapper's one way to the journal; the relay needs no seq.
		Append: func(event string, f journal.Fields, sync bool) (int64, error) {
			return 0, s.appendJournal(event, f, sync)
		},
	}
	switch s.scope.mode {
	case AgentInherit:
		s.journal("agent_inherited", nil, false)
	case AgentScoped:
		path, err := agentrelay.SocketPath(s.d.Path, os.Getenv)
		if err != nil {
			return err
		}
		r, err := agentrelay.Listen(path, upstream, s.checkAgent)
		if err != nil {
			return err
		}
		s.scope.relay = r
		s.rec.AgentSocket = path
		s.journal("agent_scoped", journal.Fields{"socket": path}, false)
	}
	return nil
}

// jobEnv is the job's environment: the wrapper's, with AGENT_WRAP_RUN_ID
// set and SSH_AUTH_SOCK as the mode says.
func (s *supervisor) jobEnv() []string {
	env := os.Environ()
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == envRunID, name == handoff.EnvControl:
			continue
		case name == envAuthSock && s.scope.mode != AgentInherit:
			continue
		case s.httpDrops(name):
			continue
		}
		out = append(out, kv)
	}
	out = append(out, envRunID+"="+s.cfg.ID)
	if c := s.controlEnv(); c != "" {
		out = append(out, c)
	}
	if s.scope.relay != nil {
		out = append(out, envAuthSock+"="+s.scope.relay.Path())
	}
	return append(out, s.httpEnv()...)
}

// markLive releases the requests waiting for the run to be recorded
// running (or for the launch to have failed: they are refused then).
func (s *supervisor) markLive() {
	s.scope.liveOnce.Do(func() { close(s.scope.live) })
}

// checkAgent is the relay's per-request check. A request that arrives
// while the job's start is being recorded waits for the record, so that a
// job whose first act is `ssh-add -l` is not refused as not running.
func (s *supervisor) checkAgent(req agentrelay.Request) agentrelay.Decision {
	<-s.scope.live
	dec, err := s.scope.gate.Decide(authority.Action{
		Channel:     authority.ChannelSSHAgent,
		Request:     req.Name,
		Key:         req.Key,
		CallerPID:   req.Caller.PID,
		CallerStart: req.Caller.Start,
		Refusal:     req.Refusal,
	})
	if err != nil {
		s.warn("ssh agent request refused: %v", err)
	}
	return agentrelay.Decision{Allow: dec.Allowed(), Reason: dec.Reason}
}

// revokeAuthority ends the relay (listener, socket, every connection),
// waits for the requests in flight to be answered (refused: the run is no
// longer running) and journals authority_revoked, so no agent request is
// journaled after it. Called once the run is ending: right after the intent
// is recorded and before any signal, or when the leader has exited and
// before stragglers are stopped. The caller must not hold the run's lock.
func (s *supervisor) revokeAuthority() {
	if s.scope == nil {
		return
	}
	s.markLive()
	s.revokeHTTP()
	if s.scope.relay == nil {
		return
	}
	r := s.scope.relay
	s.scope.relay = nil
	f := journal.Fields{"channel": authority.ChannelSSHAgent, "socket": r.Path()}
	if err := r.Revoke(); err != nil {
		s.warn("revoking the agent socket: %v", err)
		f["error"] = err.Error()
	}
	r.Wait()
	s.journal("authority_revoked", f, false)
}
