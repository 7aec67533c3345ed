package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-wrap/agent-wrap/exitcode"
)

// Quote returns words as one POSIX shell line in which each word arrives
// as exactly one argument, byte for byte: single quotes around anything but
// a plain word, a quote inside written '\”. Newlines, empty words, leading
// dashes and bytes that are not UTF-8 pass unchanged.
func Quote(words ...string) string {
	q := make([]string, len(words))
	for i, w := range words {
		if w != "" && strings.Trim(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			q[i] = w
			continue
		}
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// SplitCommand splits an --rsh value into words as a POSIX shell would
// (blanks separate words; single quotes, double quotes and backslashes
// quote), without expanding anything.
func SplitCommand(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
			inWord = true
		case c == '\\':
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("empty command")
	}
	return words, nil
}

// isSSH reports whether the rsh is OpenSSH's client, to which the
// controller adds options of its own (keepalives, -E).
func isSSH(rsh []string) bool { return filepath.Base(rsh[0]) == "ssh" }

// keepaliveOpts returns the ServerAlive options to add to every call:
// none when the user set ServerAliveInterval, on the --rsh line or in
// their ssh configuration (as `ssh -G DEST` reports it, which makes no
// connection).
func keepaliveOpts(rsh []string, dest string) []string {
	if !isSSH(rsh) {
		return nil
	}
	for _, w := range rsh {
		if strings.Contains(strings.ToLower(w), "serveraliveinterval") {
			return nil
		}
	}
	switch configMentions(rsh, "serveraliveinterval") {
	case mentioned:
		return nil
	case notMentioned:
		return defaultKeepalive
	}
	args := append(append([]string{}, rsh[1:]...), "-G", "--", dest)
	out, err := exec.Command(rsh[0], args...).Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "serveraliveinterval" && f[1] != "0" {
				return nil
			}
		}
	}
	return defaultKeepalive
}

// defaultKeepalive notices a dead connection within about 30 s.
var defaultKeepalive = []string{"-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"}

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

// host is how to reach one destination's agent-wrap.
type host struct {
	rsh       []string // the --rsh words
	dest      string
	bin       string // the remote agent-wrap
	root      string // the remote --root, or ""
	keepalive []string
	probed    chan struct{} // closed once keepalive is known
	tmpdir    string        // where ssh's -E logs go
	mux       *mux          // agent-wrap's ControlMasters for dest, or nil (see useMux)
	batch     *renewBatch   // renewals batched with the other runs to dest, or nil (renewbatch.go)
	closeOnce *sync.Once    // shared by launchHost's copies
}

// newHost checks rsh and prepares the calls' options and log directory:
// a directory in logDir named for the run (sshLogPrefix; agent-wrap ssh
// uses the ledger's own directory for a files ledger, a local state
// directory for PostgreSQL), so that what a killed controller leaves is
// found and removed when the run is settled (removeSSHLogs), never left in
// /tmp. close removes it.
func newHost(rsh []string, dest, bin, root, logDir, id string) (*host, error) {
	if len(rsh) == 0 {
		return nil, errors.New("empty --rsh")
	}
	dir, err := os.MkdirTemp(logDir, sshLogPrefix(id))
	if err != nil {
		return nil, err
	}
	h := &host{rsh: rsh, dest: dest, bin: bin, root: root, tmpdir: dir, probed: make(chan struct{}), closeOnce: new(sync.Once)}
	// `ssh -G` is a process start: run it while the caller writes its
	// ledger record; the first call waits for it.
	go func() {
		h.keepalive = keepaliveOpts(rsh, dest)
		close(h.probed)
	}()
	return h, nil
}

// noKeepalive drops the keepalive options (one short call needs none).
func (h *host) noKeepalive() {
	<-h.probed
	h.keepalive = nil
}

func (h *host) close() {
	h.closeOnce.Do(func() {
		os.RemoveAll(h.tmpdir)
		if h.mux != nil {
			h.mux.release()
		}
	})
}

// sshLogPrefix is how the names of run id's ssh log directories in the
// ledger begin. The leading dot keeps them out of the ledger's listing
// (which reads RUN_ID.json only); run IDs hold no glob characters.
func sshLogPrefix(id string) string { return ".ssh-" + id + "-" }

// removeSSHLogs removes every ssh log directory of run id from logDir:
// those of a controller that was killed before it could remove its own.
func removeSSHLogs(logDir, id string) {
	if logDir == "" {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(logDir, sshLogPrefix(id)+"*"))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

// callResult is how one remote call ended.
type callResult struct {
	code   int    // the remote command's exit status; exitcode.Lost (255) when ssh failed; -1 when killed
	sshLog string // what ssh itself said (its -E log): the last line that tells why
	err    error  // the client could not be started
	// For what the launch phase judges (see launchfail.go and precancel.go):
	fullLog string // the whole -E log
	noLog   bool   // ssh (OpenSSH) left no -E log: it ended before it opened one
	early   string // a launch's stderr before the run's record (ssh's own words, not the job's)
	viaMux  bool   // a session on one of agent-wrap's masters (mux.go): no login of its own
}

// lost reports whether the call failed as a connection: ssh's 255, or the
// client killed.
func (c callResult) lost() bool { return c.code == exitcode.Lost || c.code == -1 || c.err != nil }

// why says, for a lost call, what ssh said.
func (c callResult) why() string {
	switch {
	case c.err != nil:
		return c.err.Error()
	case c.sshLog != "":
		return c.sshLog
	case c.code == -1:
		return "the ssh client was killed"
	}
	return fmt.Sprintf("ssh exited %d", c.code)
}

var callSeq atomic.Int64

// call runs `RSH [opts] DEST LINE` and waits. stdout and stderr receive the
// remote command's streams; ssh's own messages go to a log file (OpenSSH's
// -E) and come back in the result, so they are never mistaken for the job's
// stderr. The client runs in a process group of its own, so a terminal's ^C
// reaches the controller, not its connections; ctx ending while ssh runs
// kills that group (ssh and its ProxyCommand; never once ssh is reaped,
// when the number may be another's: clientgroup.go), and the controller's
// death kills ssh (clientAttr and guardClient: orphan.go).
func (h *host) call(ctx context.Context, line string, stdout, stderr io.Writer) callResult {
	return h.callIn(ctx, line, nil, stdout, stderr)
}

// callIn is call with stdin as the remote command's stdin (nil: none).
func (h *host) callIn(ctx context.Context, line string, stdin *os.File, stdout, stderr io.Writer) callResult {
	<-h.probed
	if h.mux != nil {
		return h.mux.call(ctx, h, line, stdin, stdout, stderr)
	}
	return h.exec(ctx, nil, line, stdin, stdout, stderr)
}

// exec is one client: `RSH[0] [LogLevel] first... RSH[1:]... [opts] DEST LINE`.
func (h *host) exec(ctx context.Context, first []string, line string, stdin *os.File, stdout, stderr io.Writer) callResult {
	args := append(logLevelOpts(h.rsh), first...)
	args = append(args, h.rsh[1:]...)
	args = append(args, h.keepalive...)
	var logPath string
	if isSSH(h.rsh) {
		logPath = filepath.Join(h.tmpdir, fmt.Sprintf("ssh-%d.log", callSeq.Add(1)))
		args = append(args, "-E", logPath, "--")
	}
	args = append(args, h.dest, line)
	cmd := exec.Command(h.rsh[0], args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if stdin != nil {
		cmd.Stdin = stdin // the launch gate's pipe (launchgate.go)
	} else {
		cmd.Stdin = stdinOf(ctx) // nil: /dev/null; the launch's gateway secrets (http.go)
	}
	// Its own group (a terminal's ^C is the controller's to handle), and
	// it dies with the controller: a controller SIGKILLed leaves no client
	// behind to launch or act later, behind the back of a settle
	// (orphan.go says how, system by system).
	cmd.SysProcAttr = clientAttr()
	if first != nil {
		// A session client hands its stdio to the master (mux.go): a
		// master that is stuck holds the pipes open after the client is
		// gone, which must not hold the call.
		cmd.WaitDelay = muxWaitDelay
	}
	if err := cmd.Start(); err != nil {
		return callResult{code: exitcode.Lost, err: err}
	}
	err := waitClient(ctx, cmd) // ctx ending kills its group (clientgroup.go)
	res := callResult{}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case errors.Is(err, exec.ErrWaitDelay):
		// The client ended; its master still held the pipes.
		res.code = cmd.ProcessState.ExitCode()
	default:
		res.code, res.err = exitcode.Lost, err
	}
	if logPath != "" {
		b, err := os.ReadFile(logPath)
		res.noLog = err != nil
		res.fullLog = string(b)
		res.sshLog = sshReason(res.fullLog)
		os.Remove(logPath)
	}
	return res
}

// callTimeout is call bounded by d.
func (h *host) callTimeout(ctx context.Context, d time.Duration, line string, stdout, stderr io.Writer) callResult {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return h.call(ctx, line, stdout, stderr)
}

// remote returns the quoted line `BIN [--root ROOT] words...`.
func (h *host) remote(words ...string) string {
	w := h.base(words...)
	// A remote binary under the login's home (~/bin/agent-wrap) keeps its
	// tilde unquoted, so the remote shell expands it.
	if rest, ok := strings.CutPrefix(w[0], "~/"); ok {
		return "~/" + Quote(append([]string{rest}, w[1:]...)...)
	}
	return Quote(w...)
}

func (h *host) base(words ...string) []string {
	w := []string{h.bin}
	if h.root != "" {
		w = append(w, "--root", h.root)
	}
	return append(w, words...)
}
