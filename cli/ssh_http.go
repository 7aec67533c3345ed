package cli

import (
	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/httpgw"
)

// sshGateways checks and loads `agent-wrap ssh`'s --http* flags here, on
// the controller, before the ledger is opened: 64 for a flag wrong as
// written or an --rsh that would not pass the launch's stdin on, 66 for a
// secret or CA file that cannot be had (printed), with nothing written and
// nothing launched. file:PATH and --http-ca files are this machine's,
// env:VAR this process's environment, stdin this process's stdin (the
// job's is /dev/null). The launch sends them to the host on its own stdin
// (controller/http.go).
func (e *Env) sshGateways(f httpgw.Flags, rsh []string) ([]*httpgw.Spec, int) {
	specs, code := e.httpSpecs(f)
	if code != 0 || len(specs) == 0 {
		return nil, code
	}
	for _, s := range specs {
		if s.Source == httpgw.SourceNone && s.CAFile == "" {
			continue
		}
		if err := controller.CheckRshStdin(rsh); err != nil {
			e.errorf("ssh: --rsh: %v, and the launch sends the gateways' secrets and CAs over it", err)
			e.hint("drop that word from --rsh (or $AGENT_WRAP_RSH); nothing was recorded or launched")
			return nil, ExitUsage
		}
		break
	}
	if code := e.loadHTTP(specs, e.Stdin); code != 0 {
		return nil, code
	}
	return specs, 0
}
