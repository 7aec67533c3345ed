package cli

import (
	"context"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// The command table as data, for `help --man` and `completion`: every
// registered command with the flags of the very FlagSet it parses, which is
// what its --help prints. Nothing here lists a command or a flag by hand,
// so the man page and the completions cannot drift from --help.

// commandDoc is one command as the man page and the completions see it.
type commandDoc struct {
	*command
	flags []flagDoc
	// ids is where the command's existing RUN_IDs come from: "list" (the
	// run root), "ledger" (a command with --ledger: the controller's
	// ledger), or "" (it names no existing run: run claims a new ID).
	ids string
}

// describeCommands returns every registered command, sorted by name.
func describeCommands() []commandDoc {
	var out []commandDoc
	for _, name := range commandNames() {
		c := commands[name]
		d := commandDoc{command: c, flags: flagDocs(commandFlags(name))}
		if name != "run" && strings.Contains(c.synopsis, "RUN_ID") {
			d.ids = "list"
			if d.flag("ledger") != nil {
				d.ids = "ledger"
			}
		}
		out = append(out, d)
	}
	return out
}

func (d commandDoc) flag(name string) *flagDoc {
	for i := range d.flags {
		if d.flags[i].name == name {
			return &d.flags[i]
		}
	}
	return nil
}

// synopses returns the command's command lines, each after "agent-wrap
// [--root DIR] " (run has a second one, the short form).
func (d commandDoc) synopses() []string {
	var out []string
	for _, l := range strings.Split(d.synopsis, "\n") {
		l = strings.TrimSpace(l)
		l = strings.TrimPrefix(l, "agent-wrap [--root DIR] ")
		out = append(out, l)
	}
	return out
}

// commandFlags returns the FlagSet the command name parses: the command is
// run with --help, and the help it would print is caught instead (see
// commandHelp), so every flag is the one the command defines, in the one
// place it defines it.
func commandFlags(name string) *pflag.FlagSet {
	var got *pflag.FlagSet
	e := &Env{Ctx: context.Background(), Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard,
		Getenv:   func(string) string { return "" },
		describe: func(fs *pflag.FlagSet) { got = fs }}
	commands[name].run(e, []string{"--help"})
	if got == nil {
		// A command that prints no help for --help: only the common flags.
		got = (&Env{Stderr: io.Discard}).flags(name)
	}
	return got
}

// environment returns the environment variables the help names, each with
// the commands whose help or flags name it, sorted.
func environment(docs []commandDoc) (names []string, by map[string][]string) {
	// Compiled here, not at package level: every start of the binary
	// would pay for it.
	envVar := regexp.MustCompile(`\$([A-Z][A-Z0-9_]*[A-Z0-9])`)
	by = map[string][]string{}
	for _, d := range docs {
		text := d.help + "\n" + d.summary
		for _, f := range d.flags {
			text += "\n" + f.usage
		}
		for _, m := range envVar.FindAllStringSubmatch(text, -1) {
			if v := m[1]; !slices.Contains(by[v], d.name) {
				by[v] = append(by[v], d.name)
			}
		}
	}
	for v := range by {
		names = append(names, v)
	}
	slices.Sort(names)
	return names, by
}
