package cli

import (
	"strings"

	"github.com/spf13/pflag"
)

// flagAfterDest refuses `ssh DEST --lease 5s -- CMD`: the word after DEST
// is a flag of `agent-wrap ssh` itself and no `--` came before it, so it
// was meant for the controller; as the job's argv it would run a command
// named "--lease" on the host. args are ssh's arguments, rest what is left
// after its flags (DEST first). Found before the ledger is opened, so
// nothing is written.
func (e *Env) flagAfterDest(fs *pflag.FlagSet, args, rest []string) (int, bool) {
	if len(rest) < 2 || !isFlagOf(fs, rest[1]) {
		return 0, false
	}
	for _, w := range args[:len(args)-len(rest)+1] {
		if w == "--" {
			return 0, false // `ssh -- DEST --lease`: the words are the job's
		}
	}
	e.errorf("ssh: %s after %s: flags of `agent-wrap ssh` go before DEST", rest[1], rest[0])
	e.hint("write 'agent-wrap ssh [FLAGS] DEST -- CMD [ARG...]', %s and its value before %s; a job whose command is %s goes after '--' (ssh %s -- %s ...)", rest[1], rest[0], rest[1], rest[0], rest[1])
	return ExitUsage, true
}

// isFlagOf reports whether w is one of fs's flags: --name, --name=V, or
// -X for a shorthand X.
func isFlagOf(fs *pflag.FlagSet, w string) bool {
	switch {
	case strings.HasPrefix(w, "--") && len(w) > 2:
		name, _, _ := strings.Cut(w[2:], "=")
		return fs.Lookup(name) != nil
	case strings.HasPrefix(w, "-") && len(w) >= 2 && w[1] != '-':
		return fs.ShorthandLookup(w[1:2]) != nil
	}
	return false
}
