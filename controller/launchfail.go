package controller

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// The first connection's failures, told apart from ssh's own words: its
// exit (255, or a client that could not be started) and its -E log, or,
// for an error on its command line (found before ssh opens that log), the
// connection's stderr before the run's record.
//
// A permanent failure (the name does not resolve, the login is refused,
// the host key is not accepted, the options are wrong) fails the same way
// on every attempt, so the launch ends at once: ledger settled,
// not_started, exit 255, ssh's line quoted with what to check. Anything
// else (connection refused, timed out, reset, no route) may pass, and the
// launch is retried with the backoff, up to --give-up or a cancel.

// sshFailure is a permanent first-connection failure.
type sshFailure struct {
	line string // ssh's own line, as it said it
	hint string // what to check
}

// permanentLines are ssh's words for failures that fail the same way on
// every attempt, with what to check (%[1]s is the destination, %[2]s the
// rsh's first word). Each happens before the login: no command was sent.
var permanentLines = []struct {
	pat  string
	hint string
}{
	{"Could not resolve hostname", "check the destination %[1]q (a typo? the HostName in your ssh configuration?) and that this machine can resolve it"},
	{"Permission denied", "check the user and key ssh uses for %[1]s ('%[2]s -v %[1]s true' shows them) and the host's authorized_keys; agent-wrap ssh cannot prompt for a password or a passphrase (use an agent or a key without one)"},
	{"Too many authentication failures", "check the keys ssh offers to %[1]s (IdentitiesOnly=yes with the one key the host accepts)"},
	{"Host key verification failed", "check %[1]s's host key in your known_hosts: connect once with '%[2]s %[1]s true' to accept it, or mend the entry if the key changed"},
	{"REMOTE HOST IDENTIFICATION HAS CHANGED", "check %[1]s's host key in your known_hosts: mend the entry if the key changed for a reason you know"},
	{"Bad configuration option", "check the options on --rsh (or $AGENT_WRAP_RSH) and your ssh configuration: '%[2]s -G %[1]s' shows what ssh reads"},
	{"command-line line ", "check the options on --rsh (or $AGENT_WRAP_RSH): '%[2]s -G %[1]s' shows what ssh reads"},
	{"command-line: line ", "check the options on --rsh (or $AGENT_WRAP_RSH): '%[2]s -G %[1]s' shows what ssh reads"},
	{"Unsupported option", "check the options on --rsh (or $AGENT_WRAP_RSH) and your ssh configuration"},
	{"Bad owner or permissions on", "mend the ownership or mode of that ssh configuration file (ssh refuses it otherwise)"},
	{"Can't open user config file", "check the -F file named on --rsh"},
	{"unknown option -- ", "check the flags on --rsh (or $AGENT_WRAP_RSH)"},
	{"invalid option -- ", "check the flags on --rsh (or $AGENT_WRAP_RSH)"},
	{"option requires an argument -- ", "check the flags on --rsh (or $AGENT_WRAP_RSH)"},
	{"Unable to negotiate with", "check the algorithms your ssh configuration allows for %[1]s (KexAlgorithms, HostKeyAlgorithms, Ciphers)"},
}

// permanent reports whether a launch that ended without the run's record
// failed permanently, and how.
func permanent(h *transport.Host, res transport.Result) (sshFailure, bool) {
	if res.Err != nil {
		// The client itself could not be started.
		return sshFailure{line: res.Err.Error(), hint: fmt.Sprintf("check --rsh (or $AGENT_WRAP_RSH): %q must be a program on PATH", h.Rsh()[0])}, true
	}
	if res.Code != exitcode.Lost {
		return sshFailure{}, false
	}
	for _, text := range []string{res.FullLog, res.Early} {
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			for _, p := range permanentLines {
				if strings.Contains(line, p.pat) {
					return sshFailure{line: line, hint: fmt.Sprintf(p.hint, h.Dest(), h.Rsh()[0])}, true
				}
			}
		}
	}
	return sshFailure{}, false
}

// cannotConnect ends a launch that failed permanently: nothing was
// started, ssh's line says why.
func (r *Run) cannotConnect(f sshFailure) int {
	reason := "ssh: " + f.line
	r.settle(ledger.NotStarted, -1, "", reason)
	r.cfg.Notice(fmt.Sprintf("run %s: not started: ssh cannot connect to %s: %s", r.cfg.ID, r.cfg.Dest, f.line))
	r.cfg.Notice("hint: " + f.hint)
	return exitcode.Lost
}

// preLoginLines are ssh's words for a connection that ended before the
// login: no command can have been sent on it.
var preLoginLines = []string{
	"ssh: connect to host ", // refused, timed out, no route, unreachable
	"Connection timed out during banner exchange",
	"kex_exchange_identification: ",
	"banner exchange: ",
}

// mayHaveSent reports whether a launch that ended without the run's record
// (failed, or killed by a cancel) may have sent its command to the host.
// It is false only on evidence: the client never started or ended before
// opening its log, ssh said why it stopped before the login, or, where
// ssh's log can tell (OpenSSH at LogLevel VERBOSE, see the transport's logLevelOpts, with
// no connection sharing that could carry the command without a login of
// its own, neither the user's nor agent-wrap's: see the transport's mux.go), the log lacks
// the "Authenticated to" line that ssh writes after the login and before
// it opens the session that sends the command.
func mayHaveSent(h *transport.Host, res transport.Result) bool {
	if res.Err != nil {
		return false
	}
	if !transport.IsSSH(h.Rsh()) {
		return true // no log to judge by
	}
	if _, ok := permanent(h, res); ok {
		return false
	}
	for _, line := range strings.Split(res.FullLog, "\n") {
		for _, p := range preLoginLines {
			if strings.Contains(line, p) {
				return false
			}
		}
	}
	if res.NoLog {
		return false // ssh opens its log before it connects
	}
	if transport.QuietFlag(h.Rsh()) || transport.MuxPossible(h.Rsh()) || res.ViaMux {
		return true
	}
	return strings.Contains("\n"+res.FullLog, "\nAuthenticated to ")
}

// launchStderr is the launch connection's stderr. Until the run's record
// has arrived on stdout, what comes here is not the job's (the job's
// stderr comes from the attach, which starts after the record): it is
// ssh's own (an error on its command line is said here, before ssh opens
// its -E log) or the login's. It is held, so that it is never counted as
// the job's stderr (a reattach starts from that count), and given to the
// job's stream once the record is in; else, at the end, it is the
// controller's to judge and to pass on uncounted.
type launchStderr struct {
	r    *Run
	mu   sync.Mutex
	held bytes.Buffer
	open bool
	done chan struct{}
}

func (r *Run) newLaunchStderr() *launchStderr {
	g := &launchStderr{r: r, done: make(chan struct{})}
	go func() {
		select {
		case <-r.launched:
			g.mu.Lock()
			g.release()
			g.mu.Unlock()
		case <-g.done:
		}
	}()
	return g
}

// release gives what is held to the job's stderr; later writes go
// straight there. Called with mu held.
func (g *launchStderr) release() {
	if g.open {
		return
	}
	g.open = true
	if g.held.Len() > 0 {
		g.r.errw.Write(g.held.Bytes())
		g.held.Reset()
	}
}

func (g *launchStderr) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open && g.r.isLaunched() {
		g.release()
	}
	if g.open {
		return g.r.errw.Write(p)
	}
	return g.held.Write(p)
}

// end is called once the call and its stdout are done. It returns what
// was held when no record came (and writes it to Config.Stderr,
// uncounted); "" when the run was launched (all of it was the job's).
func (g *launchStderr) end() string {
	close(g.done)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open || g.r.isLaunched() {
		g.release()
		return ""
	}
	s := g.held.String()
	if s != "" {
		g.r.cfg.Stderr.Write(g.held.Bytes())
	}
	g.held.Reset()
	g.open = true
	return s
}
