package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
)

// Method is how the watchdog is kept running on a host.
type Method string

const (
	Systemd Method = "systemd" // a long-running service (or, with Timer, a timer)
	Cron    Method = "cron"    // one pass a minute from cron
	// BinaryOnly installs the binary alone, for a host where nothing would
	// keep the watchdog running (a container, a minimal VM): the operator
	// runs WatchdogCommand as a long-lived process (an entrypoint, a
	// sidecar, a supervisor's program).
	BinaryOnly Method = "binary-only"
)

// WatchdogCommand is the command line that keeps the watchdog of run root
// root running, with the binary at bin: the systemd service's ExecStart,
// and what a binary-only install asks the operator to run. The paths are
// clean absolute paths (NewPlan checks them), so the line needs no quoting.
func WatchdogCommand(bin, root string) string {
	return bin + " --root " + root + " watchdog --interval 5s"
}

// SystemdRunning reports whether systemd is the running service manager:
// the test sd_booted(3) makes.
func SystemdRunning() bool {
	fi, err := os.Lstat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// Options say what to install.
type Options struct {
	Method Method
	// User installs for the calling user only: binary under ~/.local,
	// systemd user units, a user crontab. Otherwise system-wide.
	User bool
	// Timer (systemd only) enables the timer rather than the long-running
	// service; both are installed either way.
	Timer bool
	// Prefix is where bin/agent-wrap goes: default /usr/local, or
	// HOME/.local with User.
	Prefix string
	// Home is the user's home directory; needed with User.
	Home string
	// RunRoot is the run root the watchdog watches; required.
	RunRoot string
	// UserName is the account the system cron line runs as.
	UserName string
	// Executable is the binary to install (normally os.Executable()).
	Executable string
}

// File is one thing an install puts in place.
type File struct {
	Path string      // absolute path on the host (before any DESTDIR)
	Perm fs.FileMode // permission bits; a directory when Dir is set
	Dir  bool        // a directory to create (Data unused)
	Data []byte
}

// Plan is an install worked out and not yet done.
type Plan struct {
	Method Method
	User   bool
	Bin    string // where the binary goes
	Files  []File
	// Activate is the shell command line that makes the service manager
	// (or cron) start what was installed; "" when there is none (cron.d is
	// read by cron itself). The install command runs it only where that is
	// possible; otherwise it is printed for the operator.
	Activate string
	// Keep is, for BinaryOnly, the line the operator must keep running
	// (WatchdogCommand); "" otherwise.
	Keep string
}

// NewPlan works out every file an install writes. It reads the executable
// but touches nothing.
func NewPlan(o Options) (*Plan, error) {
	if o.Method != Systemd && o.Method != Cron && o.Method != BinaryOnly {
		return nil, fmt.Errorf("unknown install method %q", o.Method)
	}
	if o.Timer && o.Method != Systemd {
		return nil, errors.New("a timer needs systemd")
	}
	if o.User {
		if err := checkPath("home directory", o.Home); err != nil {
			return nil, err
		}
	}
	prefix := o.Prefix
	if prefix == "" {
		prefix = "/usr/local"
		if o.User {
			prefix = filepath.Join(o.Home, ".local")
		}
	}
	if err := checkPath("prefix", prefix); err != nil {
		return nil, err
	}
	if err := checkPath("run root", o.RunRoot); err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(o.Executable)
	if err != nil {
		return nil, fmt.Errorf("read the running binary: %w", err)
	}
	p := &Plan{Method: o.Method, User: o.User, Bin: filepath.Join(prefix, "bin", "agent-wrap")}
	p.Files = append(p.Files, File{Path: p.Bin, Perm: 0o755, Data: bin})
	// agent-wrap-mcp, the MCP server `agent-wrap mcp` execs, goes where it
	// is looked for first, beside agent-wrap, when it sits beside the
	// running binary: on a controller. A host deployed to has none.
	if mcp, err := os.ReadFile(filepath.Join(filepath.Dir(o.Executable), "agent-wrap-mcp")); err == nil {
		p.Files = append(p.Files, File{Path: filepath.Join(prefix, "bin", "agent-wrap-mcp"), Perm: 0o755, Data: mcp})
	}
	d := unitData{Bin: p.Bin, Root: o.RunRoot, User: o.User, UserName: o.UserName, Marker: CronMarker}

	switch o.Method {
	case BinaryOnly:
		p.Keep = WatchdogCommand(p.Bin, o.RunRoot)
	case Systemd:
		dir := "/etc/systemd/system"
		if o.User {
			dir = filepath.Join(o.Home, ".config", "systemd", "user")
		}
		for _, name := range []string{ServiceUnit, OnceServiceUnit, TimerUnit} {
			b, err := render(name, d)
			if err != nil {
				return nil, err
			}
			p.Files = append(p.Files, File{Path: filepath.Join(dir, name), Perm: 0o644, Data: b})
		}
		ctl := "systemctl"
		if o.User {
			ctl += " --user"
		}
		unit := ServiceUnit
		if o.Timer {
			unit = TimerUnit
		}
		// restart, not start: a running watchdog must pick up a new binary.
		p.Activate = ctl + " daemon-reload && " + ctl + " enable " + unit + " && " + ctl + " restart " + unit
	case Cron:
		if o.User {
			logDir := filepath.Join(o.Home, ".local", "state", "agent-wrap")
			d.Log = filepath.Join(logDir, "watchdog.log")
			b, err := render("crontab", d)
			if err != nil {
				return nil, err
			}
			file := filepath.Join(o.Home, ".config", "agent-wrap", "watchdog.crontab")
			p.Files = append(p.Files,
				File{Path: logDir, Perm: 0o700, Dir: true},
				File{Path: file, Perm: 0o600, Data: b})
			// Replace our line in the user's crontab, keep every other one.
			p.Activate = "(crontab -l 2>/dev/null | grep -vF '" + CronMarker + "'; cat " + file + ") | crontab -"
		} else {
			if o.UserName == "" || strings.ContainsAny(o.UserName, " \t\n") {
				return nil, fmt.Errorf("cron: bad user name %q", o.UserName)
			}
			d.Log = "/var/log/agent-wrap-watchdog.log"
			b, err := render("cron.d", d)
			if err != nil {
				return nil, err
			}
			// cron reads /etc/cron.d by itself; nothing to activate. Files
			// there must not be group or world writable, and their names
			// must not contain a dot.
			p.Files = append(p.Files, File{Path: "/etc/cron.d/agent-wrap", Perm: 0o644, Data: b})
		}
	}
	return p, nil
}

// Apply puts the plan's files in place under destRoot ("" for the real
// root; otherwise every path is prefixed with it, as DESTDIR does) and
// prints one line per file to w: "installed: PATH", "updated: PATH" or
// "unchanged: PATH" ("would install: PATH", ... with dryRun, which writes
// nothing). It returns how many files changed (or would change).
func (p *Plan) Apply(w io.Writer, destRoot string, dryRun bool) (changed int, err error) {
	for _, f := range p.Files {
		target := f.Path
		if destRoot != "" {
			target = filepath.Join(destRoot, f.Path)
		}
		verb, err := f.compare(target)
		if err != nil {
			return changed, err
		}
		if verb == "unchanged" {
			fmt.Fprintf(w, "unchanged: %s\n", f.Path)
			continue
		}
		changed++
		if dryRun {
			fmt.Fprintf(w, "would %s: %s\n", dryVerb[verb], f.Path)
			continue
		}
		if err := f.write(target); err != nil {
			return changed, err
		}
		fmt.Fprintf(w, "%s: %s\n", verb, f.Path)
	}
	return changed, nil
}

var dryVerb = map[string]string{"installed": "install", "updated": "update", "created": "create"}

// compare says what writing f to target would do: "installed" (absent),
// "updated" (different) or "unchanged".
func (f File) compare(target string) (string, error) {
	fi, err := os.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		if f.Dir {
			return "created", nil
		}
		return "installed", nil
	}
	if err != nil {
		return "", err
	}
	if f.Dir {
		if !fi.IsDir() {
			return "", fmt.Errorf("%s exists and is not a directory", target)
		}
		if fi.Mode().Perm() != f.Perm {
			return "updated", nil
		}
		return "unchanged", nil
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != f.Perm || fi.Size() != int64(len(f.Data)) {
		return "updated", nil
	}
	old, err := os.ReadFile(target)
	if err != nil {
		return "", err
	}
	if !bytes.Equal(old, f.Data) {
		return "updated", nil
	}
	return "unchanged", nil
}

func (f File) write(target string) error {
	if f.Dir {
		if err := os.MkdirAll(target, f.Perm); err != nil {
			return err
		}
		return os.Chmod(target, f.Perm)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	// A pending file in the target's own directory, renamed over it: a
	// running watchdog keeps its old binary, the next start gets the new
	// one, and nobody ever sees half a file.
	t, err := renameio.NewPendingFile(target, renameio.WithTempDir(filepath.Dir(target)), renameio.WithStaticPermissions(f.Perm))
	if err != nil {
		return err
	}
	defer t.Cleanup()
	if _, err := t.Write(f.Data); err != nil {
		return err
	}
	return t.CloseAtomicallyReplace()
}

// ShellCommand renders argv as one line a POSIX shell would run as is.
func ShellCommand(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = ShellQuote(a)
	}
	return strings.Join(q, " ")
}

// ShellQuote quotes s for a POSIX shell; words that need no quoting are
// returned as they are.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
