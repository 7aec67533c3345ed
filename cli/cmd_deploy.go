//go:build linux

package cli

import (
	"fmt"

	"github.com/agent-wrap/agent-wrap/deploy"
)

func init() {
	register(&command{
		name:     "deploy",
		summary:  "copy agent-wrap to hosts over ssh and install it there",
		synopsis: "deploy [SSH FLAGS] [--dist DIR] [--systemd|--cron|--binary-only] [--user] HOST...",
		help:     deployHelp,
		exits:    "0 every host installed and (unless --dest-root) answers 'ssh HOST agent-wrap version' with it; 1 some host failed, each named on its own line; 64 usage",
		run:      runDeploy,
	})
}

const deployHelp = `For each HOST (anything ssh takes: host, user@host, ssh://user@host:port):
ask its machine (uname -sm), send the matching build from the dist directory
('make dist'), run its 'install' there, then call it as a controller will,
'ssh HOST agent-wrap version' (a non-interactive command, with sshd's PATH,
not a login shell's). One line per host on stdout: "HOST ok: ..." or "HOST
failed: REASON"; where the binary is installed but that call does not reach
it, the line names the binary's path and the hints on stderr say how to
reach it (--remote-bin PATH, a link on sshd's PATH, or a PATH line).
A failing host does not stop the others.`

// runDeploy installs agent-wrap on each HOST from this workstation: it asks
// the host's architecture (uname -m), sends the matching build from the dist
// directory with the system ssh client, runs `install` there and prints one
// line per host. A failing host does not stop the others; the exit code is
// 1 if any failed.
func runDeploy(e *Env, args []string) int {
	fs := e.flags("deploy")
	opts := fs.StringArrayP("option", "o", nil, "ssh `OPTION` (as ssh -o takes it, e.g. Port=2222); repeatable")
	port := fs.StringP("port", "p", "", "ssh `PORT`")
	identity := fs.StringP("identity", "i", "", "ssh identity `FILE`")
	sshConfig := fs.StringP("ssh-config", "F", "", "ssh configuration `FILE`")
	dist := fs.String("dist", "", "`DIR` holding agent-wrap-linux-amd64/-arm64 and SHA256SUMS (default $AGENT_WRAP_DIST, else ./dist)")
	useSystemd := fs.Bool("systemd", false, "install: keep the watchdog running with systemd")
	useCron := fs.Bool("cron", false, "install: run the watchdog from cron")
	timer := fs.Bool("timer", false, "install: enable the systemd timer instead of the service")
	binaryOnly := fs.Bool("binary-only", false, "install: the binary alone, for a host with neither systemd nor cron (a container); the line names the watchdog command to keep running there")
	userMode := fs.Bool("user", false, "install: for the remote user only (~/.local)")
	prefix := fs.String("prefix", "", "install: the binary goes to `DIR`/bin/agent-wrap")
	runRoot := fs.String("run-root", "", "install: the run root `DIR` the remote watchdog watches (default the remote user's)")
	destRoot := fs.String("dest-root", "", "install: write every file under `DIR` on the host")
	_ = fs.MarkHidden("dest-root")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	hosts := fs.Args()
	if len(hosts) == 0 {
		return e.usageError("deploy needs at least one HOST")
	}
	if *useSystemd && *useCron {
		return e.usageError("--systemd and --cron are exclusive")
	}
	if *binaryOnly && (*useSystemd || *useCron || *timer) {
		return e.usageError("--binary-only installs no watchdog; it does not go with --systemd, --cron or --timer")
	}

	r := &deploy.Remote{Dist: *dist}
	if r.Dist == "" {
		r.Dist = e.Getenv("AGENT_WRAP_DIST")
	}
	if r.Dist == "" {
		r.Dist = "dist"
	}
	if *sshConfig != "" {
		r.SSHArgs = append(r.SSHArgs, "-F", *sshConfig)
	}
	if *port != "" {
		r.SSHArgs = append(r.SSHArgs, "-p", *port)
	}
	if *identity != "" {
		r.SSHArgs = append(r.SSHArgs, "-i", *identity)
	}
	for _, o := range *opts {
		r.SSHArgs = append(r.SSHArgs, "-o", o)
	}
	for _, f := range []struct {
		set  bool
		flag string
	}{{*useSystemd, "--systemd"}, {*useCron, "--cron"}, {*timer, "--timer"}, {*binaryOnly, "--binary-only"}, {*userMode, "--user"}} {
		if f.set {
			r.InstallArgs = append(r.InstallArgs, f.flag)
		}
	}
	for _, f := range []struct{ flag, val string }{{"--prefix", *prefix}, {"--root", *runRoot}, {"--dest-root", *destRoot}} {
		if f.val != "" {
			r.InstallArgs = append(r.InstallArgs, f.flag, f.val)
		}
	}

	code := ExitOK
	for _, h := range hosts {
		res := r.Deploy(e.Ctx, h)
		fmt.Fprintln(e.Stdout, res)
		for _, hint := range res.Hints {
			e.hint("%s: %s", h, hint)
		}
		if *binaryOnly && res.Err == nil {
			e.hint("%s: nothing there keeps the watchdog running: keep the line after 'to do there' running as a long-lived process (a container's entrypoint or sidecar, a supervisor's program)", h)
		}
		if res.Err != nil {
			code = ExitFailure
		}
	}
	return code
}
