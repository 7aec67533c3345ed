package wrapper

// This file: the run's HTTP credential gateways (httpgw), beside the agent
// relay and held to the same rules: each listens after the claim and before
// the job starts, every request is decided by authority.Gate under the
// run's lock with the wrapper's own membership judgement, and all of them
// are revoked at the intent, before the first signal (revokeAuthority).
// The wrapper holds the secrets; the job gets AGENT_WRAP_HTTP_<NAME> and
// AGENT_WRAP_HTTP_<NAME>_SOCKET, and loses the env: variables a secret
// came from.

import (
	"os"
	"slices"

	"github.com/agent-wrap/agent-wrap/agentrelay"
	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// ChannelHTTPPrefix starts the journal channel of a gateway: http:NAME.
const ChannelHTTPPrefix = "http:"

// httpScope is the run's gateways.
type httpScope struct {
	gate  authority.Gate
	gws   []*httpgw.Gateway
	specs []*httpgw.Spec
	drop  []string // env: variables the job must not see
}

// startHTTP listens on every gateway of the run and records them.
func (s *supervisor) startHTTP() error {
	if len(s.cfg.HTTP) == 0 {
		return nil
	}
	h := &httpScope{specs: s.cfg.HTTP, drop: httpgw.EnvVars(s.cfg.HTTP)}
	h.gate = authority.Gate{
		Dir: s.d,
		Member: func(_ *statusfile.Record, pid int, start uint64) bool {
			_, err := s.contains(pid, start)
			return err == nil
		},
		Append: s.appendJournalSeq,
	}
	s.http = h
	s.rec.HTTP = map[string]statusfile.HTTPGateway{}
	for _, spec := range s.cfg.HTTP {
		sock, err := agentrelay.SocketPathNamed(s.d.Path, "http-"+spec.Name+".sock", os.Getenv)
		if err != nil {
			return err
		}
		channel := ChannelHTTPPrefix + spec.Name
		gw, err := httpgw.Listen(httpgw.Config{
			Spec:    spec,
			RunID:   s.cfg.ID,
			Socket:  sock,
			Check:   s.checkHTTP(channel),
			Ended:   s.endHTTP,
			Members: s.memberPIDs,
		})
		if err != nil {
			return err
		}
		h.gws = append(h.gws, gw)
		s.rec.HTTP[spec.Name] = statusfile.HTTPGateway{URL: gw.URL(), Socket: sock,
			Upstream: spec.UpstreamString(), Methods: spec.MethodList()}
		s.journal("http_gateway", journal.Fields{"channel": channel, "url": gw.URL(), "socket": sock,
			"upstream": spec.UpstreamString(), "methods": spec.MethodList(), "header": spec.Header,
			"secret": spec.Source}, false)
	}
	return nil
}

// httpDrops reports whether the job's environment must lose the variable.
func (s *supervisor) httpDrops(name string) bool {
	if s.http == nil {
		return false
	}
	if slices.Contains(s.http.drop, name) {
		return true
	}
	for _, spec := range s.http.specs { // the wrapper's own, never inherited
		if name == spec.EnvName() || name == spec.EnvName()+"_SOCKET" {
			return true
		}
	}
	return false
}

// httpEnv is the job's variables for the gateways.
func (s *supervisor) httpEnv() []string {
	if s.http == nil {
		return nil
	}
	var out []string
	for i, gw := range s.http.gws {
		n := s.http.specs[i].EnvName()
		out = append(out, n+"="+gw.URL(), n+"_SOCKET="+gw.Socket())
	}
	return out
}

// memberPIDs lists the run's live processes, where a TCP caller's socket
// is looked for: the cgroup's when the run has one, else the process
// table judged by membership. Safe from any goroutine (it judges the
// published copy of the record).
func (s *supervisor) memberPIDs() []int {
	rec := s.view.Load()
	if rec == nil {
		return nil
	}
	run := membership.Run{Record: rec, Supervisor: s.self}
	ms, ok := run.CgroupMembers()
	if !ok {
		ms, _, _ = run.Members()
	}
	pids := make([]int, 0, len(ms))
	for _, m := range ms {
		pids = append(pids, m.PID)
	}
	return pids
}

// checkHTTP is a gateway's per-request check: authority.Gate, as for the
// agent relay, after the run is recorded running.
func (s *supervisor) checkHTTP(channel string) httpgw.Check {
	return func(r httpgw.Request) httpgw.Decision {
		<-s.scope.live
		dec, err := s.http.gate.Decide(authority.Action{
			Channel:     channel,
			Request:     r.Method,
			Target:      r.Target,
			CallerPID:   r.Caller.PID,
			CallerStart: r.Caller.Start,
			Refusal:     r.Refusal,
		})
		if err != nil {
			s.warn("%s request refused: %v", channel, err)
		}
		return httpgw.Decision{Allow: dec.Allowed(), Reason: dec.Reason, Seq: dec.Seq}
	}
}

// endHTTP journals how an accepted request ended.
func (s *supervisor) endHTTP(e httpgw.End) {
	s.journal("action_end", journal.Fields{"action": e.Seq, "status": e.Status, "bytes_up": e.BytesUp,
		"bytes_down": e.BytesDown, "ms": e.Duration.Milliseconds(), "cut": e.Cut}, false)
}

// revokeHTTP closes every gateway (listeners, sockets, connections,
// requests in flight), waits for their handlers and journals
// authority_revoked per gateway with the accepted requests it cut. The
// caller must not hold the run's lock (a handler may be deciding).
func (s *supervisor) revokeHTTP() {
	h := s.http
	if h == nil || h.gws == nil {
		return
	}
	gws := h.gws
	h.gws = nil
	errs := make([]error, len(gws))
	for i, gw := range gws {
		errs[i] = gw.Revoke()
	}
	for i, gw := range gws {
		cut := gw.Wait()
		if cut == nil {
			cut = []int64{}
		}
		f := journal.Fields{"channel": ChannelHTTPPrefix + h.specs[i].Name, "url": gw.URL(), "socket": gw.Socket(), "cut": cut}
		if errs[i] != nil {
			s.warn("revoking the %s gateway: %v", h.specs[i].Name, errs[i])
			f["error"] = errs[i].Error()
		}
		s.journal("authority_revoked", f, true)
	}
}
