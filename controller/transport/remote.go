package transport

import (
	"bytes"
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

// IsSSH reports whether the rsh is OpenSSH's client, to which the
// controller adds options of its own (keepalives, -E).
func IsSSH(rsh []string) bool { return filepath.Base(rsh[0]) == "ssh" }

// keepaliveOpts returns the ServerAlive options to add to every call:
// none when the user set ServerAliveInterval, on the --rsh line or in
// their ssh configuration (configMentions, else as `ssh -G DEST` reports
// it: sshG).
func keepaliveOpts(rsh []string, dest string) []string {
	if !IsSSH(rsh) {
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
	if opts, err := sshG(rsh, dest); err == nil {
		if v := opts["serveraliveinterval"]; len(v) == 1 && v[0] != "0" {
			return nil
		}
	}
	return defaultKeepalive
}

// defaultKeepalive notices a dead connection within about 30 s.
var defaultKeepalive = []string{"-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"}

// Host is how to reach one destination's agent-wrap: the rsh words, the
// destination, the remote binary and root, and the options and masters
// its calls go with. Its calls may run concurrently; SetMux and
// NoKeepalive are for before the first.
type Host struct {
	rsh       []string // the --rsh words
	dest      string
	bin       string // the remote agent-wrap
	root      string // the remote --root, or ""
	keepalive []string
	probed    chan struct{} // closed once keepalive is known
	tmpdir    string        // where ssh's -E logs go
	mux       *mux          // agent-wrap's ControlMasters for dest, or nil (see useMux)
	batch     *renewBatch   // renewals batched with the other runs to dest, or nil (renewbatch.go)
	closeOnce *sync.Once    // shared by OwnConnection's copies
}

// NewHost checks rsh and prepares the calls' options and log directory:
// a directory in logDir named for the run (sshLogPrefix; agent-wrap ssh
// uses the ledger's own directory for a files ledger, a local state
// directory for PostgreSQL), so that what a killed controller leaves is
// found and removed when the run is settled (RemoveSSHLogs), never left in
// /tmp. Close removes it.
func NewHost(rsh []string, dest, bin, root, logDir, id string) (*Host, error) {
	if len(rsh) == 0 {
		return nil, errors.New("empty --rsh")
	}
	dir, err := os.MkdirTemp(logDir, sshLogPrefix(id))
	if err != nil {
		return nil, err
	}
	h := &Host{rsh: rsh, dest: dest, bin: bin, root: root, tmpdir: dir, probed: make(chan struct{}), closeOnce: new(sync.Once)}
	// `ssh -G` is a process start: run it while the caller writes its
	// ledger record; the first call waits for it.
	go func() {
		h.keepalive = keepaliveOpts(rsh, dest)
		close(h.probed)
	}()
	return h, nil
}

// NoKeepalive drops the keepalive options (one short call needs none).
func (h *Host) NoKeepalive() {
	<-h.probed
	h.keepalive = nil
}

// Rsh returns the host's rsh words; Dest, its destination.
func (h *Host) Rsh() []string { return h.rsh }
func (h *Host) Dest() string  { return h.dest }

// Muxed reports whether the host's calls are sessions on agent-wrap's own
// masters (mux.go).
func (h *Host) Muxed() bool { return h.mux != nil }

// OwnConnection returns a copy of h whose calls are connections of their
// own, never sessions on the masters, with opts ahead of the user's words
// (ssh takes an option's first value): the launch connection that forwards
// the controller's agent, which a session on a master would not (it would
// forward the master's). It shares h's log directory and Close.
func (h *Host) OwnConnection(opts ...string) *Host {
	<-h.probed // the copy takes the probed keepalive options
	c := *h
	c.rsh = append(append([]string{h.rsh[0]}, opts...), h.rsh[1:]...)
	c.mux = nil
	return &c
}

// Close removes the host's ssh log directory and lets its masters go
// (stopped when no other controller uses them: mux.go).
func (h *Host) Close() {
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

// RemoveSSHLogs removes every ssh log directory of run id from logDir:
// those of a controller that was killed before it could remove its own.
func RemoveSSHLogs(logDir, id string) {
	if logDir == "" {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(logDir, sshLogPrefix(id)+"*"))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

// Result is how one remote call ended.
type Result struct {
	Code   int    // the remote command's exit status; exitcode.Lost (255) when ssh failed; -1 when killed
	SSHLog string // what ssh itself said (its -E log): the last line that tells why
	Err    error  // the client could not be started
	// For what the controller's launch phase judges (its launchfail.go and
	// precancel.go):
	FullLog string // the whole -E log
	NoLog   bool   // ssh (OpenSSH) left no -E log: it ended before it opened one
	// Early is ssh's own stderr, not the job's: a master's that failed to
	// start (muxmaster.go), or, set by the controller, a launch's before the
	// run's record.
	Early  string
	ViaMux bool // a session on one of agent-wrap's masters (mux.go): no login of its own
}

// Lost reports whether the call failed as a connection: ssh's 255, or the
// client killed.
func (c Result) Lost() bool { return c.Code == exitcode.Lost || c.Code == -1 || c.Err != nil }

// Why says, for a lost call, what ssh said.
func (c Result) Why() string {
	switch {
	case c.Err != nil:
		return c.Err.Error()
	case c.SSHLog != "":
		return c.SSHLog
	case c.Code == -1:
		return "the ssh client was killed"
	}
	return fmt.Sprintf("ssh exited %d", c.Code)
}

var callSeq atomic.Int64

// Call is one remote command line and its stdio.
type Call struct {
	Line string // the remote command line (see Remote)
	// Stdin is the remote command's stdin, a pipe the caller writes (the
	// launch gate's, the job's stdin); nil: Input.
	Stdin *os.File
	// Input is bytes the client reads on stdin, then end of file (the
	// launch's gateway secrets); nil with Stdin nil: /dev/null.
	Input          []byte
	Stdout, Stderr io.Writer     // the remote command's streams
	Timeout        time.Duration // bounds the call besides ctx; 0: ctx alone
	// Long marks a session that lasts (a launch, an attach): on a master it
	// takes a ticket kept for long sessions (muxticket.go).
	Long bool
}

// Call runs `RSH [opts] DEST LINE` and waits: the one way a remote command
// is run. Stdout and stderr receive the remote command's streams; ssh's
// own messages go to a log file (OpenSSH's -E) and come back in the
// result, so they are never mistaken for the job's stderr. The client runs
// in a process group of its own, so a terminal's ^C reaches the
// controller, not its connections; ctx ending (or c.Timeout passing) while
// ssh runs kills that group (ssh and its ProxyCommand; never once ssh is
// reaped, when the number may be another's: clientgroup.go), and the
// controller's death kills ssh (clientAttr and guardClient: orphan.go).
// With the host's masters (mux.go) the call is a session on one of them.
func (h *Host) Call(ctx context.Context, c Call) Result {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	if c.Long {
		ctx = longSession(ctx)
	}
	ctx = withStdin(ctx, c.Input)
	<-h.probed
	if h.mux != nil {
		return h.mux.call(ctx, h, c.Line, c.Stdin, c.Stdout, c.Stderr)
	}
	return h.exec(ctx, nil, c.Line, c.Stdin, c.Stdout, c.Stderr)
}

// exec is one client: `RSH[0] [LogLevel] first... RSH[1:]... [opts] DEST LINE`.
func (h *Host) exec(ctx context.Context, first []string, line string, stdin *os.File, stdout, stderr io.Writer) Result {
	args := append(logLevelOpts(h.rsh), first...)
	args = append(args, h.rsh[1:]...)
	args = append(args, h.keepalive...)
	var logPath string
	if IsSSH(h.rsh) {
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
		return Result{Code: exitcode.Lost, Err: err}
	}
	err := waitClient(ctx, cmd) // ctx ending kills its group (clientgroup.go)
	res := Result{}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	case errors.Is(err, exec.ErrWaitDelay):
		// The client ended; its master still held the pipes.
		res.Code = cmd.ProcessState.ExitCode()
	default:
		res.Code, res.Err = exitcode.Lost, err
	}
	if logPath != "" {
		b, err := os.ReadFile(logPath)
		res.NoLog = err != nil
		res.FullLog = string(b)
		res.SSHLog = sshReason(res.FullLog)
		os.Remove(logPath)
	}
	return res
}

// Remote returns the quoted line `BIN [--root ROOT] words...`.
func (h *Host) Remote(words ...string) string {
	w := h.base(words...)
	// A remote binary under the login's home (~/bin/agent-wrap) keeps its
	// tilde unquoted, so the remote shell expands it.
	if rest, ok := strings.CutPrefix(w[0], "~/"); ok {
		return "~/" + Quote(append([]string{rest}, w[1:]...)...)
	}
	return Quote(w...)
}

func (h *Host) base(words ...string) []string {
	w := []string{h.bin}
	if h.root != "" {
		w = append(w, "--root", h.root)
	}
	return append(w, words...)
}

// stdinKey is the context key of the bytes a call writes to its client's
// stdin (withStdin).
type stdinKey struct{}

// withStdin returns ctx for a call whose client reads b on stdin, then
// EOF. Without it (or with no bytes) the client's stdin is /dev/null.
func withStdin(ctx context.Context, b []byte) context.Context {
	if len(b) == 0 {
		return ctx
	}
	return context.WithValue(ctx, stdinKey{}, b)
}

// stdinOf is the client's stdin for a call with ctx: nil for /dev/null.
func stdinOf(ctx context.Context) io.Reader {
	if b, ok := ctx.Value(stdinKey{}).([]byte); ok {
		return bytes.NewReader(b)
	}
	return nil
}
