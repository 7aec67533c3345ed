package cli

import "runtime"

// The host side (run, cancel, status, watchdog and the other commands that
// act on a run root) is Linux by design: it reads /proc, pidfds, cgroups
// and inotify. The controller side (ssh, ledger, settle, version, help,
// completion) builds and works on macOS and FreeBSD too. There the host
// commands are not in the table at all: the files that define them build
// on Linux only, and host_other.go puts needsLinux in run's place, which
// is where every word that is not a controller command lands (the short
// form `agent-wrap WORD ...`), so a host command added later needs no
// entry here.

// needsLinux answers a host command on a system without the host side:
// one line, and exit 125 (agent-wrap itself could not start the job).
// word is what was asked for: a command name, or a run ID in the short
// form.
func needsLinux(e *Env, word string) int {
	e.errorf("%s: running jobs and the host commands need Linux, and this agent-wrap is built for %s/%s; run on a Linux host with 'agent-wrap ssh HOST -- CMD'",
		word, runtime.GOOS, runtime.GOARCH)
	return ExitCannot
}
