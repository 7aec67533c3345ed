//go:build !linux

package cli

func init() {
	register(&command{
		name:     "run",
		summary:  "(needs Linux) run a job here; use 'agent-wrap ssh HOST -- CMD' to run on a Linux host",
		synopsis: "run RUN_ID [--] CMD [ARG...]",
		help:     "This agent-wrap is a controller build: run and the host commands (cancel, status, watchdog, ...)\nneed Linux and exit 125 here. 'agent-wrap ssh HOST -- CMD' runs CMD on a Linux host.",
		exits:    "125 always: the host side needs Linux",
		run: func(e *Env, args []string) int {
			if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
				e.commandHelp(e.Stdout, "run", e.flags("run"))
				return ExitOK
			}
			word := "run"
			if e.shortForm && len(args) > 0 {
				word = args[0]
			}
			return needsLinux(e, word)
		},
	})
}
