package controller

// The run's HTTP credential gateways (Config.HTTP, `agent-wrap ssh
// --http*`). The caller has read every secret and CA file here, on the
// controller (httpgw.Load); the host gets them only over the launch
// connection:
//   - The launch's `run --detach` carries the gateways as flags that take
//     every secret and CA from stdin (httpgw.Remote): the command line,
//     which the host's process table and sshd's log may show, names no
//     secret, no local file and no variable.
//   - The ssh client's stdin is those lines (CAs in base64, then secrets,
//     one a line), then EOF; every other call's stdin is /dev/null. The
//     host's run reads them byte by byte before it claims the ID, so
//     nothing of them reaches the job, the host's disk or its logs.
//   - A launch that is tried again (a connection lost before the host
//     claimed the run) sends them again. Once the run is seen launched,
//     the controller forgets them (the bytes are zeroed).
//   - The ledger records each gateway's name, upstream and methods, and
//     whether it adds a credential: never the secret.

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// httpLaunch is what the launch sends for the gateways.
type httpLaunch struct {
	args  []string // run's --http* flags, every secret and CA from stdin
	mu    sync.Mutex
	lines []byte // the stdin lines; nil once forgotten
}

// newHTTPLaunch checks the loaded gateways and renders them for the launch
// and for the ledger. A gateway whose secret or CA was not loaded is an
// error: sent as it is, it would forward without its credential.
func newHTTPLaunch(specs []*httpgw.Spec) (*httpLaunch, []ledger.HTTPGateway, error) {
	if len(specs) == 0 {
		return &httpLaunch{}, nil, nil
	}
	var gws []ledger.HTTPGateway
	for _, s := range specs {
		if s.Source != httpgw.SourceNone && !s.HasSecret() {
			return nil, nil, fmt.Errorf("controller: gateway %s: its secret is not loaded (httpgw.Load)", s.Name)
		}
		if s.CAFile != "" && len(s.CAPEM) == 0 {
			return nil, nil, fmt.Errorf("controller: gateway %s: its CA file is not loaded (httpgw.Load)", s.Name)
		}
		gws = append(gws, ledger.HTTPGateway{Name: s.Name, Upstream: s.UpstreamString(),
			Methods: append([]string(nil), s.MethodList()...), Secret: s.HasSecret()})
	}
	args, lines := httpgw.Remote(specs)
	return &httpLaunch{args: args, lines: lines}, gws, nil
}

// stdin returns a copy of the lines for one launch (nil: none to send) and
// a function that zeroes that copy once the call is over.
func (g *httpLaunch) stdin() ([]byte, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.lines) == 0 {
		return nil, func() {}
	}
	b := bytes.Clone(g.lines)
	return b, func() { clear(b) }
}

// forget zeroes the lines: the host has the run, no launch follows.
func (g *httpLaunch) forget() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.lines)
	g.lines = nil
}

// ErrRshNoStdin is an --rsh that would not pass the launch's stdin on
// (OpenSSH's -n or -f, or StdinNull), so the gateways' secrets could not
// reach the host.
var ErrRshNoStdin = errors.New("the ssh command does not pass stdin on")

// stdinFlags matches a group of OpenSSH's argument-less flags holding -n
// or -f.
var stdinFlags = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^-[` + transport.SSHNoArgFlags + `]*[nf][` + transport.SSHNoArgFlags + `]*$`)
})

// CheckRshStdin reports whether rsh passes its stdin to the remote
// command, as the launch of a run with gateways needs: ErrRshNoStdin
// (wrapped, naming the word) when its words hold -n, -f or StdinNull.
func CheckRshStdin(rsh []string) error {
	if len(rsh) == 0 || !transport.IsSSH(rsh) {
		return nil
	}
	for _, w := range rsh[1:] {
		if stdinFlags().MatchString(w) || strings.Contains(strings.ToLower(w), "stdinnull") {
			return fmt.Errorf("%w: %q", ErrRshNoStdin, w)
		}
	}
	return nil
}
