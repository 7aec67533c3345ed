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
	"regexp"
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

// safePath is what may be written unquoted into an ExecStart= line, a cron
// line and a shell command: no spaces, quotes, '%' (special to both systemd
// and cron), '$' or backslashes.
var safePath = regexp.MustCompile(`^/[A-Za-z0-9._/@+-]*$`)

func checkPath(what, p string) error {
	if !safePath.MatchString(p) || filepath.Clean(p) != p {
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
