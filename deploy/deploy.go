// Package deploy puts agent-wrap and its watchdog in place on a host, and
// copies it to hosts over ssh.
//
// The unit files and cron lines are embedded in the binary (units/) and
// rendered with the installed binary's path and the run root the watchdog
// watches. [NewPlan] computes every file an install writes; [Plan.Apply]
// writes them idempotently: a file whose content and mode already match is
// left alone and reported "unchanged", anything else is replaced atomically
// (a temporary file in the same directory renamed over the target, so a
// reader sees the old file or the new one, never a part). The writes are
// atomic, not durable: the directories are not synced.
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
	"path/filepath"
	"strings"
	"sync"
	"text/template"
)

//go:embed units
var unitFS embed.FS

var templates = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("").Option("missingkey=error").ParseFS(unitFS, "units/*"))
})

// Unit file names, as installed.
const (
	ServiceUnit     = "agent-wrap-watchdog.service"
	OnceServiceUnit = "agent-wrap-watchdog-once.service"
	TimerUnit       = "agent-wrap-watchdog.timer"
)

// CronMarker ends the user crontab line so it can be found and replaced.
const CronMarker = "# agent-wrap watchdog"

// unitData is what the templates see.
type unitData struct {
	Bin      string // absolute path of the installed binary
	Root     string // the run root the watchdog watches
	User     bool   // user-mode units (systemd --user, user crontab)
	UserName string // cron.d user field
	Log      string // cron: where the watchdog's output goes
	Marker   string
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

func render(name string, d unitData) ([]byte, error) {
	var b bytes.Buffer
	if err := templates().ExecuteTemplate(&b, name, d); err != nil {
		return nil, fmt.Errorf("render %s: %w", name, err)
	}
	return b.Bytes(), nil
}
