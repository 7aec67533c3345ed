package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/pflag"
)

// Help is one mechanism for every command: `agent-wrap help` lists the
// commands from the dispatch table, and `agent-wrap help CMD`, `agent-wrap
// CMD --help` and `agent-wrap CMD -h` print CMD's synopsis, purpose, text,
// flags and exit codes to stdout and exit 0. A command supplies the text in
// its `command` entry; the flags come from its own FlagSet, so they cannot
// drift from what it parses.

func init() {
	register(&command{
		name:     "help",
		summary:  "list the commands, or describe one; --man prints the manual page",
		synopsis: "help [--man] [COMMAND]",
		exits:    "0; 64 no such command",
		run:      runHelpCommand,
	})
}

func runHelpCommand(e *Env, args []string) int {
	fs := e.flags("help")
	man := fs.Bool("man", false, "print agent-wrap(1), every command's help as one man page (roff)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if *man {
		if fs.NArg() > 0 {
			return e.usageError("help --man prints the whole manual; it takes no COMMAND")
		}
		writeMan(e.Stdout)
		return ExitOK
	}
	switch fs.NArg() {
	case 0:
		e.usage(e.Stdout)
		return ExitOK
	case 1:
		c, ok := commands[fs.Arg(0)]
		if !ok {
			e.errorf("no command %q", fs.Arg(0))
			if near := nearCommands(fs.Arg(0)); len(near) > 0 {
				e.hint("did you mean %s?", orList(near))
			}
			e.hint("'agent-wrap help' lists the commands")
			return ExitUsage
		}
		// Every command's help is what its own --help prints: run it so.
		return c.run(e, []string{"--help"})
	}
	return e.usageError("help takes at most one COMMAND")
}

// The overview's words: usage prints them, and so does the man page.
var usageForms = []string{
	"agent-wrap [--root DIR] RUN_ID [--] CMD [ARG...]",
	"agent-wrap [--root DIR] COMMAND [FLAGS] ...",
}

const (
	shortFormText = `The first form is 'agent-wrap run RUN_ID -- CMD [ARG...]'. A RUN_ID that
equals or nearly equals a command name needs the explicit 'run'.`
	rootText = "every command takes --root DIR (default $AGENT_WRAP_ROOT, else $HOME/.agent-runs)"
	exitText = `exit codes: 64 usage error and 78 unsafe run root, from every command; 125 from
run when agent-wrap itself failed before the job could start. docs/reference.md has them all.`
)

// usage prints the overview: the two forms of the command line and one line
// per registered command.
func (e *Env) usage(w io.Writer) {
	fmt.Fprintln(w, "usage: "+usageForms[0])
	fmt.Fprintln(w, "       "+usageForms[1])
	fmt.Fprintln(w, "\n"+shortFormText)
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\n"+rootText)
	fmt.Fprintln(w, "'agent-wrap help COMMAND' or 'agent-wrap COMMAND --help' describes one command.")
	fmt.Fprintln(w, "\n"+exitText)
}

// commandNames returns the registered command names, sorted.
func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// commandHelp prints the help of the command name, whose flags fs holds.
func (e *Env) commandHelp(w io.Writer, name string, fs *pflag.FlagSet) {
	if e.describe != nil {
		e.describe(fs)
		return
	}
	c := commands[name]
	if c == nil {
		c = &command{name: name}
	}
	syn := c.synopsis
	if syn == "" {
		syn = name + " [FLAGS]"
	}
	fmt.Fprintf(w, "usage: agent-wrap [--root DIR] %s\n", syn)
	if c.summary != "" {
		fmt.Fprintf(w, "\n%s\n", c.summary)
	}
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(c.help, "\n"))
	}
	fmt.Fprintln(w, "\nflags:")
	printFlags(w, fs)
	if c.exits != "" {
		fmt.Fprintf(w, "\nexit: %s\n", c.exits)
	}
}

// printFlags prints one line per visible flag.
func printFlags(w io.Writer, fs *pflag.FlagSet) {
	type line struct{ left, right string }
	var lines []line
	width := 0
	for _, f := range flagDocs(fs) {
		left := "    "
		if f.short != "" {
			left = "-" + f.short + ", "
		}
		left += "--" + f.name
		if f.arg != "" {
			left += " " + f.arg
		}
		lines = append(lines, line{left, f.usage})
		width = max(width, len(left))
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  %-*s  %s\n", width, l.left, l.right)
	}
}

// flagDoc is one visible flag as help, the man page and the completions
// show it.
type flagDoc struct {
	name, short string
	arg         string   // the value's name (DIR, D, FILE, ...); "" for a bool flag
	usage       string   // the flag's text, with its default where that says something
	values      []string // the only values the flag takes (oneOf), for completion; nil: any
}

// valuesAnnotation is the pflag annotation that lists a flag's values.
const valuesAnnotation = "agent-wrap-values"

// oneOf records that flag name of fs takes only values (a mode such as
// --agent scoped|inherit|none), so that the completion scripts offer them.
func oneOf(fs *pflag.FlagSet, name string, values ...string) {
	_ = fs.SetAnnotation(name, valuesAnnotation, values)
}

// flagDocs returns fs's visible flags in name order. A default is shown
// only when it says something true: not for zero values, and not where the
// flag's own text already says what happens by default (a sentinel such as
// -1 for "the run's own grace" is an implementation detail, not a default).
func flagDocs(fs *pflag.FlagSet) []flagDoc {
	var out []flagDoc
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		varname, usage := pflag.UnquoteUsage(f)
		if f.Value.Type() == "bool" {
			varname = ""
		}
		if def := shownDefault(f); def != "" && !strings.Contains(usage, "default") {
			usage += " (default " + def + ")"
		}
		out = append(out, flagDoc{name: f.Name, short: f.Shorthand, arg: varname, usage: usage, values: f.Annotations[valuesAnnotation]})
	})
	return out
}

// shownDefault is a flag's default as help shows it: "" for a zero value,
// durations without trailing zero units ("5m", not "5m0s").
func shownDefault(f *pflag.Flag) string {
	d := f.DefValue
	switch d {
	case "", "0", "0s", "false", "[]", "<nil>":
		return ""
	}
	if f.Value.Type() == "duration" {
		if strings.HasSuffix(d, "m0s") {
			d = strings.TrimSuffix(d, "0s")
		}
		if strings.HasSuffix(d, "h0m") {
			d = strings.TrimSuffix(d, "0m")
		}
	}
	return d
}
