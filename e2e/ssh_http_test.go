package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// The HTTP credential gateway through `agent-wrap ssh`: the secret is read
// on the controller (file:LOCAL, the upstream's CA from --http-ca) and goes
// to the host only over the launch connection's stdin. The upstream is a
// TLS server started here that records what it received.

// upstream is a TLS server that records each request's path and
// Authorization header.
type upstream struct {
	srv    *httptest.Server
	caFile string
	mu     sync.Mutex
	seen   []seenRequest
}

type seenRequest struct{ path, auth string }

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{r.URL.Path, r.Header.Get("Authorization")})
		u.mu.Unlock()
		w.Write([]byte("hello from upstream"))
	}))
	t.Cleanup(u.srv.Close)
	u.caFile = filepath.Join(t.TempDir(), "ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
	if err := os.WriteFile(u.caFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *upstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

// secretFile writes a fresh random token to a file of mode 0600.
func secretFile(t *testing.T) (path, token string) {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	token = "awtok-" + hex.EncodeToString(b)
	path = filepath.Join(t.TempDir(), "gh-token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, token
}

// filesHolding lists the files under dir that hold needle.
func filesHolding(t *testing.T, dir, needle string) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed meanwhile
		}
		if d.Type().IsRegular() {
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(needle)) {
				hits = append(hits, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// procsHolding lists the processes on this machine whose argv or
// environment holds needle (the test runs as root, so it reads them all,
// the non-dumpable wrapper's too).
func procsHolding(needle string) []string {
	ents, _ := os.ReadDir("/proc")
	var hits []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), f)); err == nil && bytes.Contains(b, []byte(needle)) {
				hits = append(hits, e.Name()+"/"+f+": "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
	}
	return hits
}

// launchClient returns the argv of the controller's ssh client that runs
// the launch (`run --detach`), or nil.
func (k *ctl) launchClient() []byte {
	for _, p := range childrenOf(k.cmd.Process.Pid) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/cmdline")
		if bytes.Contains(b, []byte(" run --detach ")) {
			return b
		}
	}
	return nil
}

// TestSSHHTTPGatewaySecretFromController: curl on the host, through the
// gateway, reaches the upstream with the Bearer token read from a local
// file; the token is on no command line (the launch's ssh client's
// included), in no process environment, in no file under the host's run
// root and in no file of the controller's ledger or events. A launch
// lost before the host claimed the run is tried again and sends the
// secret again.
func TestSSHHTTPGatewaySecretFromController(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	up := startUpstream(t)
	secret, token := secretFile(t)
	gate := filepath.Join(t.TempDir(), "go")
	api := up.srv.URL + "/api"
	flags := append([]string{"--http", "gh=" + api, "--http-secret", "gh=file:" + secret, "--http-ca", "gh=" + up.caFile}, longLease...)
	job := []string{"sh", "-c", `curl -sS --fail --noproxy '*' "$AGENT_WRAP_HTTP_GH/x" && echo && while [ ! -e "$1" ]; do sleep 0.1; done`, "sh", gate}

	k := c.start("gw", flags, job...)
	runtest.Eventually(t, "the upstream's answer on the job's stdout", func() bool { return strings.Contains(k.stdout(), "hello from upstream") })
	if got := up.requests(); len(got) != 1 || got[0].path != "/api/x" || got[0].auth != "Bearer "+token {
		t.Errorf("the upstream saw %+v, want one GET /api/x with the Bearer token", got)
	}
	argv := k.launchClient()
	if !bytes.Contains(argv, []byte("--http-secret gh=stdin")) || !bytes.Contains(argv, []byte("--http-ca gh=stdin")) {
		t.Errorf("the launch's ssh client is not the one expected (secret and CA from stdin): %q", argv)
	}
	if hits := procsHolding(token); len(hits) > 0 {
		t.Errorf("the secret is in a process's argv or environment:\n%s", strings.Join(hits, "\n"))
	}
	var st struct {
		HTTP map[string]struct {
			Upstream string   `json:"upstream"`
			Methods  []string `json:"methods"`
		} `json:"http"`
	}
	b, _ := os.ReadFile(filepath.Join(c.root, "gw", "status.json"))
	if err := json.Unmarshal(b, &st); err != nil || st.HTTP["gh"].Upstream != api {
		t.Errorf("host status.json http: %+v (%v), want gh with upstream %s", st.HTTP, err, api)
	}
	os.WriteFile(gate, nil, 0o600)
	if code := k.wait(t); code != 0 {
		t.Fatalf("exit %d, want 0\nstderr: %s", code, k.stderr())
	}
	c.wantSettled("gw", "completed", "", 0)
	wantGW := []ledger.HTTPGateway{{Name: "gh", Upstream: api, Methods: []string{"GET", "HEAD"}, Secret: true}}
	if got := c.ledgerRec("gw").HTTP; !reflect.DeepEqual(got, wantGW) {
		t.Errorf("ledger http %+v, want %+v", got, wantGW)
	}

	// A launch whose connection is lost before the host claims the run
	// (the remote agent-wrap exits 255 once, as a dropped session does):
	// the controller asks, finds no run, launches again with the secret.
	dir := t.TempDir()
	tries := filepath.Join(dir, "tries")
	script := hostScript(t, dir, "case \" $* \" in *\" run --detach \"*) echo x >> "+tries+"; [ \"$(wc -l < "+tries+")\" -gt 1 ] || exit 255;; esac\n")
	job = []string{"sh", "-c", `curl -sS --fail --noproxy '*' "$AGENT_WRAP_HTTP_GH/again"`}
	k = c.start("gw-retry", append([]string{"--remote-bin", script}, flags...), job...)
	if code := k.wait(t); code != 0 {
		t.Fatalf("retried launch: exit %d, want 0\nstderr: %s", code, k.stderr())
	}
	if b, _ := os.ReadFile(tries); strings.Count(string(b), "x") != 2 {
		t.Errorf("launches: %q, want two (one lost, one claimed)", b)
	}
	if got := up.requests(); len(got) != 2 || got[1].path != "/api/again" || got[1].auth != "Bearer "+token {
		t.Errorf("after the retried launch the upstream saw %+v, want GET /api/again with the Bearer token", got)
	}
	if ev := c.ctlEvents("gw-retry"); !contains(ev, "detached") {
		t.Errorf("events %v: the first launch was not lost", ev)
	}
	c.wantSettled("gw-retry", "completed", "", 0)

	for _, dir := range []string{c.root, filepath.Dir(c.ledger), c.srv.Dir()} {
		if hits := filesHolding(t, dir, token); len(hits) > 0 {
			t.Errorf("files hold the secret: %v", hits)
		}
	}
	if strings.Contains(k.stderr(), token) {
		t.Errorf("the controller's stderr holds the secret")
	}
}
