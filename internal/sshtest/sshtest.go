// Package sshtest starts a throwaway OpenSSH server on 127.0.0.1 for tests, so
// that code meant to be driven as `ssh host agent-wrap ...` is proven through
// the real ssh client and sshd rather than a simulation.
//
// What Start guarantees:
//   - sshd listens on 127.0.0.1 only, on a port that was free when chosen;
//     nothing ever binds or dials a non-loopback address.
//   - Every key and file lives in a fresh t.TempDir: a throwaway ed25519 host
//     key, a throwaway ed25519 user key and an authorized_keys holding only it.
//     The user's own ~/.ssh, ssh config and agent are not used (-F /dev/null,
//     IdentitiesOnly=yes, IdentityAgent=none).
//   - When Start returns, a TCP connect and a real `ssh ... true` have both
//     succeeded.
//   - t.Cleanup stops the listening sshd by its recorded PID (SIGTERM, then
//     SIGKILL if it lingers) and waits for it; then it stops, again by
//     recorded PID and start time, the per-connection sshd processes that the
//     listener had forked and that are still alive. No process is ever looked
//     up by name.
//
// What it does not guarantee: the commands run over a connection are not
// stopped by Cleanup (they may have left the connection's session on
// purpose, as agent-wrap jobs do); the test that started them stops them.
//
// Where sshd, ssh or ssh-keygen is missing, Start skips the test with a hint
// to `apt-get install openssh-server`; with CI=true in the environment it fails
// the test instead, so that a CI host without sshd cannot pass by skipping.
// $SSHTEST_SSHD overrides sshd's path, so that a machine with OpenSSH can
// show what one without it does (SSHTEST_SSHD=/nonexistent).
//
// Any local account may log in (see DestinationFor) with the throwaway key:
// authorized_keys is readable by all (a public key is no secret), because
// sshd reads it with the login user's privileges.
//
// # The remote session's environment
//
// sshd runs with UsePAM no, so a remote command sees sshd's own small
// environment: HOME, USER, LOGNAME, SHELL, MAIL, SSH_CLIENT, SSH_CONNECTION
// and PATH set to sshd's compiled-in default (on Debian, for root,
// /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin). On a real
// host Debian's bash also reads ~/.bashrc for commands run by sshd; this
// server sets SHLVL=1 in the session (SetEnv), which makes bash skip it, so
// that tests neither depend on the account's startup files nor wait for them
// (a heavy .bashrc took seconds per login on a loaded machine). Nothing from
// the test's own environment crosses, not even TMPDIR, so refer to binaries
// built by the test by absolute path. Two ways to pass variables:
//   - Prefix the remote command: `env AGENT_WRAP_ROOT=/tmp/x /abs/agent-wrap ...`.
//     Always works; this is what a controller should do.
//   - `-o SetEnv=NAME=VALUE` on the client (see CommandWith). sshd accepts only
//     the names listed in AcceptEnv, which this server sets to
//     AGENT_WRAP_*, SSHTEST_*, LANG and LC_*; other names are silently dropped.
//
// # Quoting
//
// ssh joins the remote arguments with single spaces into one line and the
// remote user's shell parses it again. Arguments are therefore not passed
// through as argv: a caller must quote anything with spaces or shell
// metacharacters, for example with Quote.
package sshtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/proc"
)

// Host is the only address the server listens on and the clients dial.
const Host = "127.0.0.1"

// sshdPath is the absolute path sshd is started from (sshd refuses relative
// paths: it re-executes itself). A variable so that tests can fake its
// absence; $SSHTEST_SSHD overrides it for a whole test process.
var sshdPath = "/usr/sbin/sshd"

func init() {
	if p := os.Getenv("SSHTEST_SSHD"); p != "" {
		sshdPath = p
	}
}

// Missing reports the first OpenSSH program this machine lacks for Start
// (sshd, ssh or ssh-keygen), or nil. Packages whose every test needs sshd
// call it from TestMain to fail at once rather than skip everything.
func Missing() error { return checkTools() }

// privsepDir is the directory sshd chroots its unprivileged child into; sshd
// refuses to start when it is missing. Debian's init scripts create it at boot.
const privsepDir = "/run/sshd"

// readyTimeout bounds how long Start waits for sshd to accept a login. It is
// generous: the machines running these tests are shared and slow.
const readyTimeout = 30 * time.Second

// stopTimeout bounds how long Cleanup waits after SIGTERM before SIGKILL, and
// again after SIGKILL.
const stopTimeout = 10 * time.Second

// Server is a running sshd. Its methods are safe for concurrent use: nothing
// in it changes after Start returns.
type Server struct {
	dir     string // temp dir holding keys, config, pid file and log
	port    int
	key     string // private user key
	user    string
	logPath string
	pid     int
	start   uint64        // sshd's start time, clock ticks since boot
	done    chan struct{} // closed once cmd.Wait has returned

	defaultLimits   bool // see DefaultLimits
	maxSessions     int  // see MaxSessions; 0: OpenSSH's default, or 100
	agentForwarding bool // see AllowAgentForwarding
}

// Option changes the server Start starts.
type Option func(*Server)

// AllowAgentForwarding lets clients forward their SSH agent (ssh -A, or
// -o ForwardAgent=...): sshd then gives the session an SSH_AUTH_SOCK of its
// own, which lives as long as the connection. Without it sshd refuses
// (AllowAgentForwarding no). OpenSSH's client forwards nothing while
// IdentityAgent is none, as SSHArgs sets it: a test that forwards names
// its agent there.
func AllowAgentForwarding(s *Server) { s.agentForwarding = true }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// DefaultLimits leaves sshd's per-connection session limit (MaxSessions
// 10) and its throttling of unauthenticated connections (MaxStartups
// 10:30:100) at OpenSSH's defaults, as a real host has them. Without it
// both are 100, so that tests that open many connections are not refused.
func DefaultLimits(s *Server) { s.defaultLimits = true }

// MaxSessions is DefaultLimits with sshd's per-connection session limit
// set to n instead of OpenSSH's 10: a host where connection sharing fills
// its connections sooner.
func MaxSessions(n int) Option {
	return func(s *Server) { s.defaultLimits, s.maxSessions = true, n }
}

// T is what Start needs of its caller: a *testing.T or *testing.B (any
// testing.TB), or a harness of its own outside a test (bench/cmd/awbench),
// so that this package does not import testing.
type T interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	TempDir() string
}

// Start starts an sshd for this test and returns once a login works. See the
// package doc for what it guarantees. It calls t.Skip or t.Fatal (see above)
// when OpenSSH is not installed.
func Start(t T, opts ...Option) *Server {
	t.Helper()
	if err := checkTools(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sshtest: %v (CI=true, so this fails instead of skipping)\nhint: apt-get install openssh-server openssh-client", err)
		}
		t.Skipf("sshtest: %v\nhint: apt-get install openssh-server openssh-client", err)
	}
	if os.Geteuid() == 0 {
		// sshd checks the privilege-separation directory when run as root.
		if err := os.MkdirAll(privsepDir, 0o755); err != nil {
			t.Fatalf("sshtest: %v", err)
		}
	}
	u, err := user.Current()
	if err != nil {
		t.Fatalf("sshtest: current user: %v", err)
	}

	dir := t.TempDir()
	s := &Server{
		dir:     dir,
		key:     filepath.Join(dir, "id_ed25519"),
		user:    u.Username,
		logPath: filepath.Join(dir, "sshd.log"),
	}
	for _, o := range opts {
		o(s)
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	keygen(t, hostKey, "sshtest-host")
	keygen(t, s.key, "sshtest-user")
	pub, err := os.ReadFile(s.key + ".pub")
	if err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	// sshd reads authorized_keys as the login user: keep it where any
	// account can read it (the test's temp dirs are private).
	keysDir, err := os.MkdirTemp("", "sshtest-keys-")
	if err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(keysDir) })
	authKeys := filepath.Join(keysDir, "authorized_keys")
	if err := os.Chmod(keysDir, 0o755); err != nil {
		t.Fatalf("sshtest: %v", err)
	}
	if err := os.WriteFile(authKeys, pub, 0o644); err != nil {
		t.Fatalf("sshtest: %v", err)
	}

	// The port is free when chosen but may be taken before sshd binds it
	// (other tests run alongside); sshd then exits, and we try another.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s.port, err = freePort()
		if err != nil {
			t.Fatalf("sshtest: %v", err)
		}
		config := filepath.Join(dir, "sshd_config")
		if err := os.WriteFile(config, []byte(s.config(hostKey, authKeys)), 0o600); err != nil {
			t.Fatalf("sshtest: %v", err)
		}
		lastErr = s.launch(t, config)
		if lastErr == nil {
			return s
		}
	}
	t.Fatalf("sshtest: sshd did not become ready: %v\n%s", lastErr, s.Log())
	return nil
}

// checkTools reports the first OpenSSH program that is not installed.
func checkTools() error {
	if _, err := os.Stat(sshdPath); err != nil {
		return fmt.Errorf("sshd not found at %s", sshdPath)
	}
	for _, name := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Errorf("%s not found in PATH", name)
		}
	}
	return nil
}

// keygen writes a new passphrase-less ed25519 key pair to path and path.pub.
func keygen(t T, path, comment string) {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("sshtest: ssh-keygen %s: %v\n%s", path, err, out)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(Host, "0"))
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// config returns the sshd_config text for this server.
func (s *Server) config(hostKey, authKeys string) string {
	lines := []string{
		"ListenAddress " + net.JoinHostPort(Host, strconv.Itoa(s.port)),
		"HostKey " + hostKey,
		"PidFile " + filepath.Join(s.dir, "sshd.pid"),
		"AuthorizedKeysFile " + authKeys,
		"PermitRootLogin prohibit-password",
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"UsePAM no",
		"StrictModes no",
		"PermitUserEnvironment no",
		"AcceptEnv AGENT_WRAP_* SSHTEST_* LANG LC_*",
		// bash reads ~/.bashrc for commands run by sshd, but only when it is
		// the first shell level: keep the account's startup files (slow, and
		// not what is under test) out of every login.
		"SetEnv SHLVL=1",
		"X11Forwarding no",
		"AllowTcpForwarding no",
		"AllowAgentForwarding " + yesNo(s.agentForwarding),
		"PrintMotd no",
		"PrintLastLog no",
		"UseDNS no",
		"LogLevel VERBOSE",
	}
	if !s.defaultLimits {
		lines = append(lines, "MaxStartups 100", "MaxSessions 100")
	}
	if s.maxSessions > 0 {
		lines = append(lines, "MaxSessions "+strconv.Itoa(s.maxSessions))
	}
	return strings.Join(lines, "\n") + "\n"
}

// launch starts sshd with config and waits until a login works. On failure it
// stops what it started and returns why; on success it registers Cleanup.
func (s *Server) launch(t T, config string) error {
	t.Helper()
	cmd := exec.Command(sshdPath, "-D", "-e", "-E", s.logPath, "-f", config)
	// Its own process group, so a terminal's ^C reaches the test, not sshd.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.pid = cmd.Process.Pid
	s.start, _ = startTime(s.pid)
	s.done = make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(s.done)
	}()

	err := s.waitReady()
	if err != nil {
		select {
		case <-s.done:
			err = fmt.Errorf("sshd exited: %v (before that: %v)", waitErr, err)
		default:
			s.stop(t)
		}
		return err
	}
	t.Cleanup(func() { s.stop(t) })
	return nil
}

// waitReady polls until a TCP connect and then `ssh true` succeed, sshd
// exits, or readyTimeout passes.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	addr := net.JoinHostPort(Host, strconv.Itoa(s.port))
	lastErr := errors.New("not tried")
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return lastErr
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			lastErr = err
			time.Sleep(20 * time.Millisecond) // poll interval, not synchronisation
			continue
		}
		c.Close()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		out, err := s.Command(ctx, "true").CombinedOutput()
		cancel()
		if err == nil {
			return nil
		}
		lastErr = fmt.Errorf("ssh true: %v: %s", err, bytes.TrimSpace(out))
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", readyTimeout, lastErr)
}

// stop ends the listener by its PID and waits for it, then ends the
// per-connection sshd processes it had forked.
func (s *Server) stop(t T) {
	select {
	case <-s.done:
		return
	default:
	}
	// Children of the listener are the per-connection monitors. Record them
	// (PID and start time) before the listener goes and they are re-parented.
	children := childrenOf(s.pid)
	_ = syscall.Kill(s.pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(s.pid, syscall.SIGKILL)
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
			t.Errorf("sshtest: sshd pid %d did not exit after SIGKILL", s.pid)
			return
		}
	}
	for _, c := range children {
		if st, ok := startTime(c.pid); ok && st == c.start {
			_ = syscall.Kill(c.pid, syscall.SIGTERM)
		}
	}
	// TERM, then KILL past stopTimeout; either way stop returns only once
	// the process is gone (a zombie counts as gone), so a caller that
	// checks right after sees no per-connection sshd of this server.
	deadline := time.Now().Add(stopTimeout)
	for _, c := range children {
		killed := false
		for proc.Alive(c.pid, c.start) {
			if !killed && time.Now().After(deadline) {
				if st, ok := startTime(c.pid); ok && st == c.start {
					_ = syscall.Kill(c.pid, syscall.SIGKILL)
				}
				killed = true
				deadline = time.Now().Add(stopTimeout)
			} else if killed && time.Now().After(deadline) {
				t.Errorf("sshtest: per-connection sshd pid %d did not exit after SIGKILL", c.pid)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// SSHArgs returns the ssh client options for this server, without the
// destination: port, the throwaway key, no host key checking, no ssh config,
// no agent, batch mode (never prompt), errors only, and a connect timeout.
// It returns a new slice on every call.
func (s *Server) SSHArgs() []string {
	return []string{
		"-F", "/dev/null",
		"-p", strconv.Itoa(s.port),
		"-i", s.key,
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityAgent=none",
		"-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null",
		"-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=10",
	}
}

// Key returns the path of the private user key the server accepts (its
// public half is Key()+".pub"), for loading it into an agent.
func (s *Server) Key() string { return s.key }

// Destination returns user@host for the ssh command line.
func (s *Server) Destination() string { return s.user + "@" + Host }

// DestinationFor returns name@host: any local account with a valid shell
// and an unlocked password field may log in with the server's key.
func (s *Server) DestinationFor(name string) string { return name + "@" + Host }

// Host returns the address the server listens on: always 127.0.0.1.
func (s *Server) Host() string { return Host }

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// User returns the login name the server accepts: the current user.
func (s *Server) User() string { return s.user }

// PID returns the listening sshd's process ID.
func (s *Server) PID() int { return s.pid }

// StartTime returns the listening sshd's start time in clock ticks since boot,
// as in /proc/PID/stat field 22, for checking that it is gone.
func (s *Server) StartTime() uint64 { return s.start }

// Dir returns the server's temp dir (keys, config, log).
func (s *Server) Dir() string { return s.dir }

// Log returns sshd's log so far, for failure messages.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no sshd log: %v)", err)
	}
	return string(b)
}

// Command returns `ssh SSHArgs... -- user@127.0.0.1 remote...`. ssh joins the
// remote words with spaces into one line for the remote shell: quote them
// (see Quote). ctx kills the local ssh client only, not the remote command.
func (s *Server) Command(ctx context.Context, remote ...string) *exec.Cmd {
	return s.CommandWith(ctx, nil, remote...)
}

// CommandWith is Command with extra client options placed before the
// destination, for example []string{"-tt"} for a PTY or
// []string{"-o", "SetEnv=AGENT_WRAP_ROOT=/tmp/x"}.
func (s *Server) CommandWith(ctx context.Context, opts []string, remote ...string) *exec.Cmd {
	args := s.SSHArgs()
	args = append(args, opts...)
	args = append(args, "--", s.Destination())
	args = append(args, remote...)
	return exec.CommandContext(ctx, "ssh", args...)
}

// Quote returns args as one POSIX shell line in which each argument is a
// single word, for use as the remote command.
func Quote(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = quote1(a)
	}
	return strings.Join(q, " ")
}

func quote1(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
