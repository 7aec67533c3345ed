package cli

// The --http* flags of run and ssh: one definition of their words, and of
// how their errors are told (64 for a flag that is wrong as written, 66 for
// a secret or CA that cannot be had), both before anything is claimed,
// recorded or launched.

import (
	"errors"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/agent-wrap/agent-wrap/httpgw"
)

// addHTTPFlags adds the repeatable gateway flags to fs. StringArray, not
// StringSlice: a method list or a header template holds commas.
func addHTTPFlags(fs *pflag.FlagSet, f *httpgw.Flags) {
	fs.StringArrayVar(&f.HTTP, "http", nil, "a credential gateway `NAME=URL` for the job (https://HOST[:PORT][/PREFIX]; http:// only to loopback): the job gets $AGENT_WRAP_HTTP_<NAME>, never the secret")
	fs.StringArrayVar(&f.Secret, "http-secret", nil, "`NAME=SOURCE`: the gateway's secret from file:PATH (mode 0600), env:VAR (removed from the job's environment) or stdin (one line)")
	fs.StringArrayVar(&f.Header, "http-header", nil, "`NAME=TEMPLATE`: the credential header, holding {secret} or {basic} once (default \"Authorization: Bearer {secret}\")")
	fs.StringArrayVar(&f.Allow, "http-allow", nil, "`NAME=METHODS`: the methods forwarded, comma-separated, or * (default GET,HEAD)")
	fs.StringArrayVar(&f.CA, "http-ca", nil, "`NAME=FILE`: extra PEM roots for the gateway's upstream (stdin: one base64 line)")
}

// httpSpecs checks the gateway flags; code is 64 (printed) when they are
// wrong as written.
func (e *Env) httpSpecs(f httpgw.Flags) (specs []*httpgw.Spec, code int) {
	if f.Empty() {
		return nil, 0
	}
	specs, err := httpgw.Parse(f)
	if err != nil {
		e.errorf("%v", err)
		var ue *httpgw.UsageError
		if errors.As(err, &ue) && ue.Hint != "" {
			e.hint("%s", ue.Hint)
		}
		e.hint("nothing was claimed or run")
		return nil, ExitUsage
	}
	return specs, 0
}

// loadHTTP reads the gateways' secrets and CA files (stdin lines from
// stdin, env: variables from this process's environment); code is 66
// (printed) when one cannot be had. It first makes this process
// non-dumpable when a secret is to be read, so that no process of the same
// user can read it out of this one's memory.
func (e *Env) loadHTTP(specs []*httpgw.Spec, stdin io.Reader) int {
	if len(specs) == 0 {
		return 0
	}
	for _, s := range specs {
		if s.Source != httpgw.SourceNone {
			if err := httpgw.NoDump(); err != nil {
				e.errorf("cannot protect the gateway secrets: %v", err)
				return ExitCannot
			}
			break
		}
	}
	if err := httpgw.Load(specs, stdin, os.Getenv); err != nil {
		e.errorf("%v", err)
		var ie *httpgw.InputError
		if errors.As(err, &ie) && ie.Hint != "" {
			e.hint("%s", ie.Hint)
		}
		e.hint("nothing was claimed or run")
		var ue *httpgw.UsageError
		if errors.As(err, &ue) {
			return ExitUsage
		}
		return ExitNoInput
	}
	return 0
}
