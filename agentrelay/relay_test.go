package agentrelay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/internal/agenttest"
	"github.com/agent-wrap/agent-wrap/internal/privsock"
	"github.com/agent-wrap/agent-wrap/proc"
)

// recorder is a Check that allows what the relay passes and keeps every
// request it saw.
type recorder struct {
	mu    sync.Mutex
	reqs  []Request
	allow func(n int) bool // nil: allow all
}

func (r *recorder) check(req Request) Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	if req.Refusal != "" {
		return Decision{Reason: req.Refusal}
	}
	if r.allow != nil && !r.allow(len(r.reqs)) {
		return Decision{Reason: "test says no"}
	}
	return Decision{Allow: true, Reason: "ok"}
}

func (r *recorder) seen() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.reqs...)
}

func startRelay(t *testing.T, upstream string, check Check) *Relay {
	t.Helper()
	path := filepath.Join(t.TempDir(), SocketName)
	r, err := Listen(path, upstream, check)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Revoke(); r.Wait() })
	return r
}

// dial returns an agent client on a new connection to path.
func dial(t *testing.T, path string) agent.ExtendedAgent {
	t.Helper()
	return agent.NewClient(rawDial(t, path))
}

// rawDial returns a new connection to path, for writing frames by hand
// (an agent client reads its connection from a goroutine of its own).
func rawDial(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sshAdd(sock string, args ...string) (string, int, error) {
	cmd := exec.Command("ssh-add", args...)
	cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	out, err := cmd.CombinedOutput()
	pid := 0
	if cmd.Process != nil {
		pid = cmd.Process.Pid
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil
	}
	return string(out), pid, err
}

// The relay passes identities, sign and session-bind to the real agent and
// nothing else; every request reaches the check once, named, with the
// caller's PID and the key's fingerprint only.
func TestRelayPassesOnlyIdentitiesSignSessionBind(t *testing.T) {
	a := agenttest.Start(t)
	rec := &recorder{}
	r := startRelay(t, a.Sock, rec.check)

	// ssh-add -l, a real client, lists the key through the relay.
	out, pid, err := sshAdd(r.Path(), "-l")
	if err != nil || !strings.Contains(out, a.Fingerprint) {
		t.Fatalf("ssh-add -l through the relay: %v\n%s", err, out)
	}
	reqs := rec.seen()
	if len(reqs) != 1 || reqs[0].Name != ReqIdentities || reqs[0].Caller.PID != pid || reqs[0].Refusal != "" {
		t.Fatalf("after ssh-add -l (pid %d) the check saw %+v", pid, reqs)
	}

	// A signature made through the relay verifies with the key.
	client := dial(t, r.Path())
	keys, err := client.List()
	if err != nil || len(keys) != 1 {
		t.Fatalf("List: %v %v", keys, err)
	}
	data := []byte("data to sign")
	sig, err := client.Sign(keys[0], data)
	if err != nil {
		t.Fatalf("Sign through the relay: %v", err)
	}
	pub, err := ssh.ParsePublicKey(keys[0].Blob)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Verify(data, sig); err != nil {
		t.Fatalf("signature from the relay does not verify: %v", err)
	}
	reqs = rec.seen()
	last := reqs[len(reqs)-1]
	if last.Name != ReqSign || last.Key != a.Fingerprint || last.Caller.PID != os.Getpid() {
		t.Fatalf("sign request seen as %+v, want key %s from pid %d", last, a.Fingerprint, os.Getpid())
	}
	self, _ := proc.ReadStat(os.Getpid())
	if last.Caller.Start != self.Start {
		t.Fatalf("caller start %d, want %d", last.Caller.Start, self.Start)
	}

	// session-bind goes upstream, and the agent's failure (a bogus binding)
	// comes back as a failure.
	n := len(rec.seen())
	if _, err := client.Extension(SessionBind, []byte("not a binding")); err == nil {
		t.Fatal("a bogus session-bind succeeded through the relay")
	}
	reqs = rec.seen()
	if len(reqs) != n+1 || reqs[n].Name != ReqSessionBind || reqs[n].Refusal != "" {
		t.Fatalf("session-bind seen as %+v", reqs[n:])
	}

	// Everything else is refused and never reaches the agent.
	refused := []struct {
		name string
		do   func() error
	}{
		{"19", func() error { // ssh-add -D
			out, _, err := sshAdd(r.Path(), "-D")
			if err != nil {
				return err
			}
			if strings.Contains(out, "All identities removed") {
				return nil
			}
			return errors.New(out)
		}},
		{"17", func() error { // ssh-add of a new key
			k := filepath.Join(t.TempDir(), "other")
			if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k).CombinedOutput(); err != nil {
				t.Fatalf("ssh-keygen: %v\n%s", err, out)
			}
			out, _, err := sshAdd(r.Path(), k)
			if err != nil {
				return err
			}
			if strings.Contains(out, "Identity added") {
				return nil
			}
			return errors.New(out)
		}},
		{"22", func() error { return client.Lock([]byte("pw")) }},
		{"27", func() error { _, err := client.Extension("query", nil); return err }},
	}
	for _, c := range refused {
		n := len(rec.seen())
		if err := c.do(); err == nil {
			t.Errorf("request %s was not refused", c.name)
		}
		// ssh-add -D also sends the protocol 1 remove-all (9) after 19.
		reqs := rec.seen()
		if len(reqs) <= n || reqs[n].Name != c.name {
			t.Errorf("request %s seen as %+v", c.name, reqs[n:])
		}
		for _, req := range reqs[n:] {
			if req.Refusal != ReasonNotRelayed {
				t.Errorf("request %s: %+v not refused as not relayed", c.name, req)
			}
		}
	}
	// The agent still holds exactly its one key.
	out, _, _ = sshAdd(a.Sock, "-l")
	if strings.Count(out, "SHA256:") != 1 || !strings.Contains(out, a.Fingerprint) {
		t.Fatalf("the agent's keys changed through the relay:\n%s", out)
	}
}

// The check is asked at every request, not once per connection.
func TestRelayChecksEveryRequest(t *testing.T) {
	a := agenttest.Start(t)
	rec := &recorder{allow: func(n int) bool { return n != 2 }}
	r := startRelay(t, a.Sock, rec.check)
	client := dial(t, r.Path())
	if _, err := client.List(); err != nil {
		t.Fatalf("first request: %v", err)
	}
	if _, err := client.List(); err == nil {
		t.Fatal("second request on the same connection was not refused")
	}
	if keys, err := client.List(); err != nil || len(keys) != 1 {
		t.Fatalf("third request: %v %v", keys, err)
	}
}

// Revoke removes the socket and ends open connections: a request on a
// connection opened before fails, and nothing can connect any more.
func TestRelayRevoke(t *testing.T) {
	a := agenttest.Start(t)
	rec := &recorder{}
	r := startRelay(t, a.Sock, rec.check)
	client := dial(t, r.Path())
	keys, err := client.List()
	if err != nil || len(keys) != 1 {
		t.Fatalf("before revoke: %v %v", keys, err)
	}
	if err := r.Revoke(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(r.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket still there after Revoke: %v", err)
	}
	n := len(rec.seen())
	if _, err := client.Sign(keys[0], []byte("x")); err == nil {
		t.Fatal("sign on a connection opened before Revoke succeeded")
	}
	if _, err := net.Dial("unix", r.Path()); err == nil {
		t.Fatal("connected after Revoke")
	}
	if len(rec.seen()) != n {
		t.Fatalf("the check was asked after Revoke: %+v", rec.seen()[n:])
	}
	done := make(chan struct{})
	go func() { r.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("relay goroutines still running 30s after Revoke")
	}
}

// Malformed and oversized frames: a sign request that does not decode is
// refused (and seen); a frame over the limit ends the connection.
func TestRelayMalformed(t *testing.T) {
	a := agenttest.Start(t)
	rec := &recorder{}
	r := startRelay(t, a.Sock, rec.check)
	c := rawDial(t, r.Path())
	if err := writeMessage(c, []byte{msgSignRequest, 0, 0, 0, 9, 1}); err != nil {
		t.Fatal(err)
	}
	answer, err := readMessage(c)
	if err != nil || !bytes.Equal(answer, []byte{msgFailure}) {
		t.Fatalf("malformed sign: answer %v, %v", answer, err)
	}
	if reqs := rec.seen(); len(reqs) != 1 || reqs[0].Name != ReqSign || reqs[0].Refusal != ReasonMalformed || reqs[0].Key != "" {
		t.Fatalf("seen %+v", reqs)
	}
	var big [4]byte
	binary.BigEndian.PutUint32(big[:], maxMessage+1)
	if _, err := c.Write(big[:]); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := readMessage(c); err == nil {
		t.Fatal("an oversized frame got an answer")
	}
}

// TestMain lets the test binary act as a short-lived client: with
// AGENTRELAY_HELPER_CONNECT=PATH it connects to PATH, hands the connection to
// its parent over fd 3 (SCM_RIGHTS) and exits.
func TestMain(m *testing.M) {
	if path := os.Getenv("AGENTRELAY_HELPER_CONNECT"); path != "" {
		os.Exit(helperConnect(path))
	}
	os.Exit(m.Run())
}

func helperConnect(path string) int {
	c, err := net.Dial("unix", path)
	if err != nil {
		return 1
	}
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		return 1
	}
	if err := unix.Sendmsg(3, []byte{0}, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		return 1
	}
	return 0
}

// A connection whose connecting process has exited is refused at its next
// request, whoever holds it now (here: the test, handed the descriptor with
// SCM_RIGHTS by a child that then exited).
func TestRelayRefusesACallerThatIsGone(t *testing.T) {
	a := agenttest.Start(t)
	rec := &recorder{}
	r := startRelay(t, a.Sock, rec.check)
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	child := os.NewFile(uintptr(pair[1]), "pair")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "AGENTRELAY_HELPER_CONNECT="+r.Path())
	cmd.ExtraFiles = []*os.File{child}
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	child.Close()
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(pair[0], buf, oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages: %v %v", msgs, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights: %v %v", fds, err)
	}
	c, err := net.FileConn(os.NewFile(uintptr(fds[0]), "relay"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := writeMessage(c, []byte{msgRequestIdentities}); err != nil {
		t.Fatal(err)
	}
	if answer, err := readMessage(c); err != nil || !bytes.Equal(answer, []byte{msgFailure}) {
		t.Fatalf("answer %v, %v", answer, err)
	}
	if reqs := rec.seen(); len(reqs) != 1 || reqs[0].Refusal != authority.ReasonCallerGone || reqs[0].Caller.PID != cmd.Process.Pid {
		t.Fatalf("seen %+v (helper pid %d)", reqs, cmd.Process.Pid)
	}
}

func TestSocketPath(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	short := filepath.Join(t.TempDir(), "run-1")
	if p, err := SocketPath(short, env(nil)); err != nil || p != filepath.Join(short, SocketName) {
		t.Fatalf("short run dir: %q %v", p, err)
	}
	longRoot := filepath.Join(t.TempDir(), strings.Repeat("r", 60), strings.Repeat("o", 60))
	id128 := strings.Repeat("x", 127) + "1"
	rt := t.TempDir()
	if err := os.Chmod(rt, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		dir  string
		env  map[string]string
		want string
	}{
		"long-root":           {filepath.Join(longRoot, "run-1"), nil, "/tmp/agent-wrap-"},
		"128-char-id":         {filepath.Join(t.TempDir(), id128), nil, "/tmp/agent-wrap-"},
		"128-char-id/runtime": {filepath.Join(t.TempDir(), id128), map[string]string{"XDG_RUNTIME_DIR": rt}, filepath.Join(rt, "agent-wrap") + "/"},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := SocketPath(c.dir, env(c.env))
			if err != nil {
				t.Fatal(err)
			}
			if len(p) > privsock.MaxPath || !strings.HasPrefix(p, c.want) {
				t.Fatalf("path %q (%d bytes), want under %s", p, len(p), c.want)
			}
			if again, _ := SocketPath(c.dir, env(c.env)); again != p {
				t.Fatalf("second call gave %q, first %q", again, p)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Dir(p), &st); err != nil || st.Mode&0o7777 != 0o700 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				t.Fatalf("socket directory: mode %o, %v", st.Mode, err)
			}
			r, err := Listen(p, "", func(Request) Decision { return Decision{} })
			if err != nil {
				t.Fatal(err)
			}
			defer r.Revoke()
			if err := unix.Lstat(p, &st); err != nil || st.Mode&0o777 != 0o600 {
				t.Fatalf("socket mode %o, %v", st.Mode&0o777, err)
			}
			c, err := net.Dial("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
	}
	// A per-user directory open to others is not used: /tmp's is.
	open := filepath.Join(t.TempDir(), "agent-wrap")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := SocketPath(filepath.Join(t.TempDir(), id128), env(map[string]string{"XDG_RUNTIME_DIR": filepath.Dir(open)}))
	if err != nil || !strings.HasPrefix(p, "/tmp/agent-wrap-") {
		t.Fatalf("with a 0755 runtime directory: %q %v", p, err)
	}
}
