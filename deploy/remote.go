package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Remote installs agent-wrap on hosts through the system ssh client, so
// the operator's ssh configuration, agent, known_hosts and jump hosts all
// apply as they would to `ssh HOST`.
type Remote struct {
	// SSH is the ssh program; "" means "ssh" from $PATH.
	SSH string
	// SSHArgs go before the host on every ssh command line (e.g. "-o",
	// "Port=2222"). They come first, so they win over the defaults Remote
	// adds (BatchMode=yes, ConnectTimeout=10, ServerAliveInterval=15,
	// ServerAliveCountMax=4): ssh keeps the first value it is given for an
	// option.
	SSHArgs []string
	// Dist is the directory holding agent-wrap-linux-amd64 and
	// agent-wrap-linux-arm64 (what `make dist` builds) and, optionally,
	// SHA256SUMS, which each build is checked against before it is sent.
	Dist string
	// InstallArgs are the flags given to `agent-wrap install` on the host.
	InstallArgs []string
}

// Result is what happened on one host.
type Result struct {
	Host    string
	Arch    string   // GOARCH of the build sent, once known
	Changed int      // files the remote install changed
	Files   int      // files the remote install reported
	Output  string   // the remote install's output
	Ran     bool     // the remote install started the watchdog itself
	Next    []string // commands the remote install left for the operator
	Bin     string   // where the remote install put the binary
	// Reachable: `ssh HOST agent-wrap version`, as a controller calls it,
	// ran the binary just installed. False when the check was not made
	// (--dest-root, --dry-run) or failed (then Err says so).
	Reachable bool
	Hints     []string // what to do about Err, best first
	Err       error    // nil: installed, and reachable unless not checked
}

// String is the one line the deploy command prints for the host.
func (r Result) String() string {
	if r.Err != nil {
		return fmt.Sprintf("%s failed: %v", r.Host, r.Err)
	}
	what := fmt.Sprintf("%d of %d files changed", r.Changed, r.Files)
	if r.Changed == 0 {
		what = "unchanged"
	}
	if r.Ran {
		what += ", watchdog (re)started"
	}
	if len(r.Next) > 0 {
		what += "; to do there: " + strings.Join(r.Next, "; ")
	}
	if r.Reachable {
		what += "; 'ssh " + r.Host + " agent-wrap version' runs " + r.Bin
	} else {
		what += "; not checked over ssh (files written under --dest-root, or --dry-run)"
	}
	return fmt.Sprintf("%s ok: linux/%s, %s", r.Host, r.Arch, what)
}

// goarch maps `uname -m` to the Go architecture of the build to send. (A
// switch, not a package-level map: a map literal is built at every start
// of the binary.)
func goarch(machine string) (string, bool) {
	switch machine {
	case "x86_64", "amd64":
		return "amd64", true
	case "aarch64", "arm64":
		return "arm64", true
	}
	return "", false
}

// Deploy copies the matching build to host ([user@]name, as ssh takes it),
// runs its install there and removes the copy. It never panics on a bad
// host: every failure is in the Result.
func (r *Remote) Deploy(ctx context.Context, host string) (res Result) {
	res.Host = host
	if host == "" || strings.HasPrefix(host, "-") || strings.ContainsAny(host, " \t\n'\"\\$`;&|<>") {
		res.Err = fmt.Errorf("not a host name: %q", host)
		return res
	}

	// 1. What is it?
	out, err := r.ssh(ctx, host, nil, "uname -sm")
	if err != nil {
		res.Err = err
		return res
	}
	// The last line: a login shell's startup files may print before it.
	uname := lastLine(string(out))
	f := strings.Fields(uname)
	if len(f) != 2 || f[0] != "Linux" {
		res.Err = fmt.Errorf("not a Linux host: uname -sm says %q", uname)
		return res
	}
	arch, ok := goarch(f[1])
	if !ok {
		res.Err = fmt.Errorf("no build for machine %q (have amd64 for x86_64, arm64 for aarch64)", f[1])
		return res
	}
	res.Arch = arch

	// 2. The build for it, checked against SHA256SUMS when there is one.
	bin, err := r.build(arch)
	if err != nil {
		res.Err = err
		return res
	}

	// 3. Copy it to a private temporary file there.
	out, err = r.ssh(ctx, host, bin,
		`umask 077 && t=$(mktemp "${TMPDIR:-/tmp}/agent-wrap.XXXXXX") && cat >"$t" && chmod 700 "$t" && echo "$t"`)
	if err != nil {
		res.Err = fmt.Errorf("copy: %w", err)
		return res
	}
	tmp := lastLine(string(out))
	if !strings.HasPrefix(tmp, "/") || strings.ContainsAny(tmp, " \t\n'\"\\$`;&|<>") {
		res.Err = fmt.Errorf("copy: unexpected temporary path %q", tmp)
		return res
	}

	// 4. Install from the copy, and remove it whatever happens.
	install := append([]string{tmp, "install"}, r.InstallArgs...)
	out, err = r.ssh(ctx, host, nil,
		ShellCommand(install)+" 2>&1; rc=$?; rm -f "+ShellQuote(tmp)+"; exit $rc")
	res.Output = string(out)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "next: "); ok {
			res.Next = append(res.Next, rest)
			continue
		}
		if strings.HasPrefix(line, "ran: ") {
			res.Ran = true
			continue
		}
		verb, path, ok := strings.Cut(line, ": /")
		if ok && res.Bin == "" && strings.HasSuffix(path, "/bin/agent-wrap") {
			res.Bin = "/" + path // the binary is the first file install names
		}
		switch {
		case !ok:
		case verb == "unchanged":
			res.Files++
		case verb == "installed" || verb == "updated" || verb == "created":
			res.Files++
			res.Changed++
		}
	}
	if err != nil {
		res.Err = fmt.Errorf("install: %w", err)
		return res
	}

	// 5. Call it as a controller will: `ssh HOST agent-wrap version`, a
	// non-interactive command with sshd's PATH, not a login shell's.
	if slices.Contains(r.InstallArgs, "--dest-root") || slices.Contains(r.InstallArgs, "--dry-run") {
		return res // the files are not where a controller would look
	}
	r.checkReach(ctx, &res)
	return res
}

// checkReach runs `agent-wrap version` on the host the way a controller
// will, and compares it with the installed binary's own answer. On a
// mismatch it asks the host for its non-interactive PATH and sets Err and
// the Hints that fix it.
func (r *Remote) checkReach(ctx context.Context, res *Result) {
	if res.Bin == "" {
		res.Err = errors.New("the remote install did not say where it put the binary")
		return
	}
	out, err := r.ssh(ctx, res.Host, nil, ShellQuote(res.Bin)+" version")
	want, verr := versionLine(string(out))
	if err != nil || verr != nil {
		res.Err = fmt.Errorf("the installed %s does not run: %v", res.Bin, errors.Join(err, verr))
		return
	}
	out, err = r.ssh(ctx, res.Host, nil, "agent-wrap version")
	got, verr := versionLine(string(out))
	switch {
	case err != nil:
		err = fmt.Errorf("%w: 'ssh %s agent-wrap version' fails: %v", errNotReachable, res.Host, err)
	case verr != nil:
		err = fmt.Errorf("%w: 'ssh %s agent-wrap version': %v", errNotReachable, res.Host, verr)
	case got != want:
		err = fmt.Errorf("%w: 'ssh %s agent-wrap version' runs another agent-wrap (%s), not the one installed (%s)", errNotReachable, res.Host, got, want)
	default:
		res.Reachable = true
		return
	}
	res.Err = fmt.Errorf("installed %s, but it is %w", res.Bin, err)
	probe, _ := r.ssh(ctx, res.Host, nil, ReachProbe)
	for _, f := range ParseReach(res.Bin, string(probe)).Fixes() {
		res.Hints = append(res.Hints, strings.ReplaceAll(f, " HOST ", " "+res.Host+" "))
	}
}

// build reads dist/agent-wrap-linux-ARCH and checks it against
// dist/SHA256SUMS if that file exists.
func (r *Remote) build(arch string) ([]byte, error) {
	name := "agent-wrap-linux-" + arch
	path := filepath.Join(r.Dist, name)
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("no %s build: %w (run 'make dist', or pass --dist DIR)", arch, err)
	}
	sums, err := os.ReadFile(filepath.Join(r.Dist, "SHA256SUMS"))
	if errors.Is(err, os.ErrNotExist) {
		return bin, nil
	}
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(bin)
	for _, line := range strings.Split(string(sums), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.TrimPrefix(f[1], "*") == name {
			if f[0] != hex.EncodeToString(sum[:]) {
				return nil, fmt.Errorf("%s does not match its SHA256SUMS entry; rebuild with 'make dist'", path)
			}
			return bin, nil
		}
	}
	return nil, fmt.Errorf("%s is not listed in %s", name, filepath.Join(r.Dist, "SHA256SUMS"))
}

// ssh runs one remote shell command and returns its stdout. A failure
// carries the last line of stderr (where ssh says why it could not connect)
// or of the output.
func (r *Remote) ssh(ctx context.Context, host string, stdin []byte, remote string) ([]byte, error) {
	prog := r.SSH
	if prog == "" {
		prog = "ssh"
	}
	args := append([]string{}, r.SSHArgs...)
	// Never prompt; give up on a host that does not answer, or stops
	// answering mid-copy, so one bad host cannot hold up the rest.
	args = append(args, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
		"-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "--", host, remote)
	cmd := exec.CommandContext(ctx, prog, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		why := lastLine(stderr.String())
		if why == "" {
			why = lastLine(stdout.String())
		}
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee) && ee.ExitCode() == 255:
			err = fmt.Errorf("ssh: %s", strings.TrimPrefix(why, "ssh: "))
		case errors.As(err, &ee) && why != "":
			err = fmt.Errorf("%s (exit %d)", why, ee.ExitCode())
		}
		return stdout.Bytes(), err
	}
	return stdout.Bytes(), nil
}

// lastLine is the last non-empty line of s that is not a hint: the reason.
func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.Contains(l, ": hint: ") {
			return l
		}
	}
	return ""
}
