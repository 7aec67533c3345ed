package httpgw_test

// End-to-end tests of the HTTP credential gateway: the real binary, a real
// TLS upstream (httptest) that records what reached it, real clients (curl,
// Python's urllib, git). Processes are stopped by recorded PID and process
// group, never by name.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
)

// python is the system's python3: a job that runs as another user cannot
// reach one under root's home.
const python = "/usr/bin/python3"

func TestMain(m *testing.M) {
	for _, tool := range []string{"curl", "git", "setpriv", python} {
		if _, err := exec.LookPath(tool); err != nil {
			// make test installs them (.ci/deps); never skip for want of one.
			panic("the gateway tests need " + tool + ": run .ci/deps")
		}
	}
	os.Exit(m.Run())
}

// seen is one request as the upstream received it.
type seen struct {
	Method, Path, Query, Auth, Upgrade string
	At                                 int64 // CLOCK_BOOTTIME, as the journal's mono_ns
}

// upstream is a TLS server that records every request it receives.
type upstream struct {
	srv    *httptest.Server
	caFile string
	mu     sync.Mutex
	reqs   []seen
	// slow holds /api/slow requests until it is closed or the request
	// ends; started tells when one has arrived.
	slow    chan struct{}
	started chan struct{}
	extra   http.Handler // serves /git/ when set
}

func newUpstream(t *testing.T, extra http.Handler) *upstream {
	t.Helper()
	u := &upstream{slow: make(chan struct{}), started: make(chan struct{}, 16), extra: extra}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.StartTLS()
	t.Cleanup(func() {
		select {
		case <-u.slow:
		default:
			close(u.slow)
		}
		u.srv.CloseClientConnections()
		u.srv.Close()
	})
	u.caFile = filepath.Join(t.TempDir(), "ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
	if err := os.WriteFile(u.caFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	u.reqs = append(u.reqs, seen{At: ts.Nano(), Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
		Auth: r.Header.Get("Authorization"), Upgrade: r.Header.Get("Upgrade")})
	u.mu.Unlock()
	switch {
	case u.extra != nil && strings.HasPrefix(r.URL.Path, "/git/"):
		u.extra.ServeHTTP(w, r)
	case r.URL.Path == "/api/slow":
		u.hold(w, r, false)
	case r.URL.Path == "/api/slow-sized":
		// The same with a length: the gateway gathers such a body into
		// larger writes, and must still pass on what it has meanwhile.
		u.hold(w, r, true)
	case r.URL.Path == "/api/redirect-out":
		http.Redirect(w, r, "https://elsewhere.invalid/steal", http.StatusFound)
	case r.URL.Path == "/api/redirect-in":
		http.Redirect(w, r, "/api/landed?x=1", http.StatusFound)
	case r.URL.Path == "/api/big":
		w.Header().Set("Content-Length", "1048576")
		w.Write(make([]byte, 1<<20))
	default:
		w.Write([]byte("ok " + r.URL.EscapedPath() + "\n"))
	}
}

// hold answers "first\n" at once and holds the rest of the response until
// u.slow is closed (then "later\n" when sized, the body's length said up
// front) or the request ends.
func (u *upstream) hold(w http.ResponseWriter, r *http.Request, sized bool) {
	u.started <- struct{}{}
	if sized {
		w.Header().Set("Content-Length", "12")
	} else {
		w.Header().Set("Content-Type", "text/plain")
	}
	w.WriteHeader(200)
	w.Write([]byte("first\n"))
	w.(http.Flusher).Flush()
	select {
	case <-u.slow:
		if sized {
			w.Write([]byte("later\n"))
		}
	case <-r.Context().Done():
	}
}

// requests returns what the upstream has received so far.
func (u *upstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

// base is the upstream's https://127.0.0.1:PORT.
func (u *upstream) base() string { return u.srv.URL }

// newSecret writes a fresh token to a 0600 file and returns both.
func newSecret(t *testing.T) (token, file string) {
	t.Helper()
	b := make([]byte, 12)
	rand.Read(b)
	token = "tok-" + hex.EncodeToString(b)
	file = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return token, file
}

// aw runs the binary with root as its run root.
func aw(t *testing.T, root string, args ...string) (int, string, string) {
	t.Helper()
	return runtest.Exec(t, root, args...)
}

// event returns the journal's events named name.
func events(es []journal.Entry, name string) []journal.Entry {
	var out []journal.Entry
	for _, e := range es {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}

// field returns an event's field as text ("" when absent).
func field(e journal.Entry, k string) string {
	v, ok := e.Fields[k]
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// grepTree fails the test if any file under dir holds needle.
func grepTree(t *testing.T, dir string, needle []byte) {
	t.Helper()
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("cannot read %s: %v", p, err)
			return nil
		}
		n++
		if bytes.Contains(b, needle) {
			t.Errorf("%s holds the secret", p)
		}
		return nil
	})
	if n == 0 {
		t.Errorf("no file under %s to search", dir)
	}
}

// waitFor waits for cond with the tests' patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	runtest.Eventually(t, what, cond)
}
