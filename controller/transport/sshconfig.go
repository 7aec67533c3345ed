package transport

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// The user's ssh configuration, as the transport asks about it: does it
// set ServerAliveInterval (keepaliveOpts), a ControlPath (setsControl)?
// configMentions answers most runs from the files alone; where it cannot
// tell, sshG asks `ssh -G DEST`, once per rsh and destination for the
// whole process, whoever asks and however many hosts go there.

const (
	mentioned    = iota // the option's name is in the configuration
	notMentioned        // it is in none of the files ssh would read
	cannotTell          // ask ssh -G
)

// configMentions looks for an option's name, case-insensitively, anywhere
// in the ssh configuration files the rsh reads (-F FILE, else ~/.ssh/config
// and /etc/ssh/ssh_config, following Include globs): a fast, conservative
// answer (a mention under any Host counts) that spares most runs the start
// of `ssh -G`. Anything it cannot follow (an unreadable file, a deep
// Include, a token in an Include) is cannotTell.
func configMentions(rsh []string, option string) int {
	home, _ := os.UserHomeDir()
	var files []string
	userDir := filepath.Join(home, ".ssh")
	for i := 1; i < len(rsh); i++ {
		w := rsh[i]
		switch {
		case w == "-F" && i+1 < len(rsh):
			files = []string{rsh[i+1]}
		case strings.HasPrefix(w, "-F") && len(w) > 2:
			files = []string{w[2:]}
		case strings.HasPrefix(w, "-") && strings.ContainsAny(w[1:], "F") && !strings.HasPrefix(w, "-o"):
			return cannotTell // -F inside a group of flags
		}
	}
	if files == nil {
		if home == "" {
			return cannotTell
		}
		files = []string{filepath.Join(userDir, "config"), "/etc/ssh/ssh_config"}
	}
	seen := 0
	var visit func(path, rel string, depth int) int
	visit = func(path, rel string, depth int) int {
		if path == "/dev/null" {
			return notMentioned
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return notMentioned
		}
		if err != nil || depth > 4 || seen > 64 {
			return cannotTell
		}
		seen++
		if strings.Contains(strings.ToLower(string(b)), option) {
			return mentioned
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(strings.ReplaceAll(line, "=", " "))
			if len(f) == 0 || !strings.EqualFold(f[0], "include") {
				continue
			}
			for _, pat := range f[1:] {
				if strings.ContainsAny(pat, "%$~\"'") {
					return cannotTell
				}
				if !filepath.IsAbs(pat) {
					pat = filepath.Join(rel, pat)
				}
				matches, err := filepath.Glob(pat)
				if err != nil {
					return cannotTell
				}
				for _, m := range matches {
					if r := visit(m, rel, depth+1); r != notMentioned {
						return r
					}
				}
			}
		}
		return notMentioned
	}
	for _, f := range files {
		rel := userDir
		if f == "/etc/ssh/ssh_config" {
			rel = "/etc/ssh"
		}
		if r := visit(f, rel, 0); r != notMentioned {
			return r
		}
	}
	return notMentioned
}

// sshGAnswer is what `ssh -G` said for one rsh and destination: each
// option (as ssh prints it, lower case) with the words of its first line,
// or err when ssh failed.
type sshGAnswer struct {
	opts map[string][]string
	err  error
}

var (
	sshGMu    sync.Mutex
	sshGCache = map[string]func() sshGAnswer{} // rsh words and dest -> the one ssh -G
)

// sshG returns the options `RSH[1:]... -G -- DEST` prints (which makes no
// connection), running it at most once per rsh words and destination in
// this process: a second asker, at the same time or later, gets the first
// one's answer.
func sshG(rsh []string, dest string) (map[string][]string, error) {
	key := strings.Join(append(append([]string{}, rsh...), "\x00", dest), "\x00")
	sshGMu.Lock()
	get := sshGCache[key]
	if get == nil {
		get = sync.OnceValue(func() sshGAnswer {
			args := append(append([]string{}, rsh[1:]...), "-G", "--", dest)
			out, err := exec.Command(rsh[0], args...).Output()
			if err != nil {
				return sshGAnswer{err: err}
			}
			opts := map[string][]string{}
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) > 0 {
					if _, seen := opts[f[0]]; !seen {
						opts[f[0]] = f[1:]
					}
				}
			}
			return sshGAnswer{opts: opts}
		})
		sshGCache[key] = get
	}
	sshGMu.Unlock()
	a := get()
	return a.opts, a.err
}
