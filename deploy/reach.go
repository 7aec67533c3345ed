package deploy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Two things decide whether an install is of any use, and neither is a file
// install writes: a controller must reach the binary as `ssh HOST agent-wrap`,
// a non-interactive command that gets sshd's PATH and not the login shell's;
// and the watchdog's method must have something to run it.

// CronDirs are the directories searched for a cron daemon besides $PATH:
// a daemon lives in an sbin directory, which a non-root user's PATH lacks.
// A variable so that tests can simulate a host without cron.
var CronDirs = []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"}

// cronDaemons are the programs that run cron jobs: Debian's cron, cronie's
// crond, busybox's crond, and systemd-cron's generator.
var cronDaemons = []string{"cron", "crond", "busybox-crond", "systemd-crontab-generator"}

// CronMissing reports what is missing on this host for the watchdog to run
// from cron: no cron daemon installed, or (for a user install, whose line
// goes into the user's crontab) no crontab program. It returns nil when
// cron can run it.
func CronMissing(user bool) []string {
	var missing []string
	if findCron() == "" {
		missing = append(missing, "a cron daemon (no "+strings.Join(cronDaemons, ", ")+
			" in $PATH or "+strings.Join(CronDirs, ", ")+")")
	}
	if user {
		if _, err := exec.LookPath("crontab"); err != nil {
			missing = append(missing, "the crontab program (not in $PATH)")
		}
	}
	return missing
}

func findCron() string {
	for _, name := range cronDaemons {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range CronDirs {
			p := filepath.Join(d, name)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	return ""
}

// Reach is what a host's non-interactive ssh command line sees, and what to
// do when it does not find the installed binary.
type Reach struct {
	Bin      string   // the installed binary's absolute path
	Path     []string // $PATH of a non-interactive ssh command
	Writable []string // the directories of Path the user may write
	Home     string
	Shell    string
}

// ReachProbe is the remote shell line that prints what [ParseReach] reads:
// run as `ssh HOST LINE`, it shows the PATH and environment sshd gives a
// command, not a login shell's.
const ReachProbe = `printf 'path %s\n' "$PATH"; printf 'home %s\n' "$HOME"; printf 'shell %s\n' "$SHELL"; ` +
	`IFS=:; for d in $PATH; do [ -d "$d" ] && [ -w "$d" ] && printf 'writable %s\n' "$d"; done; exit 0`

// ParseReach reads ReachProbe's output for the binary bin.
func ParseReach(bin, out string) Reach {
	r := Reach{Bin: bin}
	for _, line := range strings.Split(out, "\n") {
		key, val, _ := strings.Cut(line, " ")
		switch key {
		case "path":
			r.Path = filepath.SplitList(val)
		case "home":
			r.Home = val
		case "shell":
			r.Shell = val
		case "writable":
			r.Writable = append(r.Writable, val)
		}
	}
	return r
}

// LocalReach is Reach for this process's user (home directory and login
// shell given), for `install` itself, with path as the PATH a
// non-interactive ssh command would get.
func LocalReach(bin string, path []string, home, shell string) Reach {
	r := Reach{Bin: bin, Path: path, Home: home, Shell: shell}
	for _, d := range path {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() && unix.Access(d, unix.W_OK) == nil {
			r.Writable = append(r.Writable, d)
		}
	}
	return r
}

// OnPath reports whether the PATH lookup of "agent-wrap" finds r.Bin.
func (r Reach) OnPath() bool {
	for _, d := range r.Path {
		p := filepath.Join(d, "agent-wrap")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return sameFile(p, r.Bin)
		}
	}
	return false
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// Fixes returns, best first, what makes `ssh HOST agent-wrap` find r.Bin,
// each a line to show the operator: call it by its path; a link in a
// directory on sshd's PATH that the user may write; the PATH line for the
// shell's startup file or ~/.ssh/environment.
func (r Reach) Fixes() []string {
	dir := filepath.Dir(r.Bin)
	fixes := []string{"call it by its path: agent-wrap ssh --remote-bin " + r.Bin + " HOST -- CMD (or ssh HOST " + r.Bin + " ...)"}
	for _, d := range r.Writable {
		fixes = append(fixes, "or link it into a directory on sshd's PATH there: ln -s "+r.Bin+" "+filepath.Join(d, "agent-wrap"))
		break
	}
	path := dir
	if r.Home != "" && strings.HasPrefix(dir, r.Home+"/") {
		path = "$HOME" + strings.TrimPrefix(dir, r.Home)
	}
	switch filepath.Base(r.Shell) {
	case "bash":
		fixes = append(fixes, `or put this line at the top of ~/.bashrc, above its "If not running interactively" return: export PATH="`+path+`:$PATH"`)
	case "zsh":
		fixes = append(fixes, `or put this line in ~/.zshenv: export PATH="`+path+`:$PATH"`)
	}
	full := append([]string{dir}, r.Path...)
	fixes = append(fixes, "or, where sshd has PermitUserEnvironment yes, this line in ~/.ssh/environment: PATH="+strings.Join(full, ":"))
	return fixes
}

// SSHDefaultPath is the PATH OpenSSH's sshd gives a command on Debian and
// its derivatives when nothing else sets one (its compiled-in default, for
// root and for other users). install uses it to predict what a controller's
// `ssh HOST agent-wrap` will find; deploy asks the host instead.
func SSHDefaultPath(uid int) []string {
	if uid == 0 {
		return strings.Split("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", ":")
	}
	return strings.Split("/usr/local/bin:/usr/bin:/bin:/usr/games", ":")
}

// errNotReachable is the error of a deploy whose binary was installed but is
// not what `ssh HOST agent-wrap` runs.
var errNotReachable = errors.New("not reachable as 'agent-wrap' by a non-interactive ssh command")

// versionLine checks that out, the output of `agent-wrap version`, is a
// version line, and returns it.
func versionLine(out string) (string, error) {
	l := lastLine(out)
	if !strings.HasPrefix(l, "agent-wrap ") {
		return "", fmt.Errorf("'agent-wrap version' printed %s, not a version", strconv.Quote(l))
	}
	return l, nil
}
