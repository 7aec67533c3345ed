// Package deploy puts agent-wrap and its watchdog in place on a host, and
// copies it to hosts over ssh.
//
// The unit files and cron lines are embedded in the binary (units/) and
// rendered with the installed binary's path and the run root the watchdog
// watches (see [render] for their two marks). [NewPlan] computes every file an install writes; [Plan.Apply]
// writes them idempotently: a file whose content and mode already match is
// left alone and reported "unchanged", anything else is replaced atomically
// (a temporary file in the same directory renamed over the target, so a
// reader sees the old file or the new one, never a part). The writes are
// atomic, not durable: the directories are not synced.
//
// [Install] is `agent-wrap install` on this host: the method [ChooseMethod]
// picked, the checks that refuse before anything is written (a plan
// NewPlan refuses, cron where nothing would run it, a run root the
// watchdog would refuse), the run root created, the plan applied; then
// [Installed.Activate] starts the watchdog, or says what to run.
//
// [Remote] is the workstation side: it picks the build matching a host's
// `uname -m` from a dist directory, copies it there with the system ssh
// client and runs its install.
//
// What gets installed where, and how to undo it, is in README.md.
package deploy

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

//go:embed units
var unitFS embed.FS

// Unit file names, as installed.
const (
	ServiceUnit     = "agent-wrap-watchdog.service"
	OnceServiceUnit = "agent-wrap-watchdog-once.service"
	TimerUnit       = "agent-wrap-watchdog.timer"
)

// CronMarker ends the user crontab line so it can be found and replaced.
const CronMarker = "# agent-wrap watchdog"

// unitData is what render fills in.
type unitData struct {
	Bin      string // absolute path of the installed binary
	Root     string // the run root the watchdog watches
	User     bool   // user-mode units (systemd --user, user crontab)
	UserName string // cron.d user field
	Log      string // cron: where the watchdog's output goes
	Marker   string
	// Package: the units are a package's (package.go), not install's.
	Package bool
}

// safePath reports whether p may be written unquoted into an ExecStart=
// line, a cron line and a shell command: an absolute path of letters,
// digits and ._/@+- only, so no spaces, quotes, '%' (special to both
// systemd and cron), '$' or backslashes. A byte loop rather than a regexp:
// a package-level regexp is compiled at every start of the binary, cancel
// and the watchdog included, for a check only install and deploy make.
func safePath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("._/@+-", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func checkPath(what, p string) error {
	if !safePath(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%s %q: must be a clean absolute path of letters, digits and ._/@+- only", what, p)
	}
	return nil
}

// hardeningFile is the block of hardening settings both services share.
const hardeningFile = "hardening"

// render fills in units/name. The files are plain text with two marks:
//
//   - {{Key}} is replaced by a value: Bin, Root, UserName, Log, Marker;
//     UserFlag (" --user" for user units, else empty); WantedBy
//     (default.target or multi-user.target); InstalledBy (the install
//     command line, or "the agent-wrap package"); Hardening
//     (units/hardening, rendered the same way, without its last newline).
//   - A line that starts with {{system}} is kept, without the mark, in
//     system units and left out of user units.
//
// Any other {{...}} is an error. Values are written as they are, never
// scanned for marks themselves.
//
// Not text/template: it calls reflect's Method lookups, and a binary that
// links it keeps every exported method of every type it keeps, because
// the linker cannot tell which a template will call. That cost 1.7 MiB of
// a 6.3 MiB binary, for five fixed files with a few values and one
// condition (system or user units).
func render(name string, d unitData) ([]byte, error) {
	return renderFS(unitFS, name, d)
}

// renderFS is render over the files units/* of fsys.
func renderFS(fsys fs.FS, name string, d unitData) ([]byte, error) {
	vals := map[string]string{
		"Bin": d.Bin, "Root": d.Root, "UserName": d.UserName, "Log": d.Log, "Marker": d.Marker,
		"UserFlag": "", "WantedBy": "multi-user.target",
	}
	if d.User {
		vals["UserFlag"], vals["WantedBy"] = " --user", "default.target"
	}
	vals["InstalledBy"] = "'agent-wrap install --systemd" + vals["UserFlag"] + "'"
	if d.Package {
		vals["InstalledBy"] = "the agent-wrap package (not enabled; see the package's post-install message)"
	}
	if name != hardeningFile {
		h, err := renderFS(fsys, hardeningFile, d)
		if err != nil {
			return nil, err
		}
		vals["Hardening"] = strings.TrimSuffix(string(h), "\n")
	}
	src, err := fs.ReadFile(fsys, "units/"+name)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", name, err)
	}
	var b bytes.Buffer
	for line := range strings.SplitAfterSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "{{system}}"); ok {
			if d.User {
				continue
			}
			line = rest
		}
		for {
			i := strings.Index(line, "{{")
			if i < 0 {
				b.WriteString(line)
				break
			}
			j := strings.Index(line[i:], "}}")
			if j < 0 {
				return nil, fmt.Errorf("render %s: unclosed {{ in %q", name, line)
			}
			key := line[i+2 : i+j]
			v, ok := vals[key]
			if !ok {
				return nil, fmt.Errorf("render %s: unknown mark {{%s}}", name, key)
			}
			b.WriteString(line[:i])
			b.WriteString(v)
			line = line[i+j+2:]
		}
	}
	return b.Bytes(), nil
}
