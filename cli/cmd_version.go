package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Stamped at build time with -ldflags "-X ...cli.version=... -X ...cli.commit=...".
var (
	version = "dev"
	commit  = ""
)

func init() {
	register(&command{
		name:     "version",
		summary:  "print version, commit and Go version",
		synopsis: "version",
		exits:    "0",
		run:      runVersion,
	})
}

// Version returns the stamped version and commit (commit falls back to the
// VCS information Go embedded, if any).
func Version() (ver, rev string) {
	rev = commit
	if rev == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					rev = s.Value
				}
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	return version, rev
}

func runVersion(e *Env, args []string) int {
	fs := e.flags("version")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	v, c := Version()
	fmt.Fprintf(e.Stdout, "agent-wrap %s commit %s %s %s/%s\n", v, c, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return ExitOK
}
