package httpgw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// pyClient fetches URL (over TCP) or, with a socket path, PATH over the
// unix socket, with Python's standard library, and prints the body.
const pyClient = `
import http.client, os, socket, sys, urllib.request
if len(sys.argv) == 2:
    print(urllib.request.urlopen(sys.argv[1]).read().decode(), end="")
else:
    class UnixConn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(sys.argv[1])
    c = UnixConn("gateway")
    c.request("GET", sys.argv[2])
    print(c.getresponse().read().decode(), end="")
`

func writeScript(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// 1. curl and Python's urllib, through the TCP base and the unix socket:
// the upstream sees the Bearer token; the job's environment, argv, run
// directory and journal hold no byte of it; an env: variable is gone from
// the job's environment.
func TestSecretReachesUpstreamOnly(t *testing.T) {
	up := newUpstream(t, nil)
	token, file := newSecret(t)
	envToken := token + "-env"
	py := writeScript(t, "client.py", pyClient)
	root := runtest.NewRoot(t)
	job := fmt.Sprintf(`set -e
curl -sSf "$AGENT_WRAP_HTTP_GH/repos/x?page=2"
curl -sSf --unix-socket "$AGENT_WRAP_HTTP_GH_SOCKET" http://gateway/unix/curl
%[1]s %[2]s "$AGENT_WRAP_HTTP_GH/py/tcp"
%[1]s %[2]s "$AGENT_WRAP_HTTP_GH_SOCKET" /py/unix
curl -sSf "$AGENT_WRAP_HTTP_LLM/v1/models"
env
cat /proc/$$/cmdline | tr '\0' ' '
`, python, py)
	c := runtest.StartWith(t, root, func(c *exec.Cmd) { c.Env = append(c.Env, "LLM_TOKEN="+envToken) },
		"run", "--lease", "2m",
		"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+file, "--http-ca", "gh="+up.caFile,
		"--http", "llm="+up.base()+"/api", "--http-secret", "llm=env:LLM_TOKEN", "--http-ca", "llm="+up.caFile,
		"--http-header", "llm=X-Api-Key: {secret}",
		"one", "--", "sh", "-c", job)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("run: exit %d\nstdout: %s\nstderr: %s", code, c.Stdout.String(), c.Stderr.String())
	}
	out := c.Stdout.String()
	for _, want := range []string{"ok /api/repos/x", "ok /api/unix/curl", "ok /api/py/tcp", "ok /api/py/unix", "ok /api/v1/models",
		"AGENT_WRAP_HTTP_GH=http://127.0.0.1:", "AGENT_WRAP_HTTP_GH_SOCKET=/", "AGENT_WRAP_HTTP_LLM="} {
		if !strings.Contains(out, want) {
			t.Errorf("job output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{token, "LLM_TOKEN", envToken} {
		if strings.Contains(out, bad) {
			t.Errorf("the job saw %q (environment or argv):\n%s", bad, out)
		}
	}
	reqs := up.requests()
	if len(reqs) != 5 {
		t.Fatalf("upstream saw %d requests, want 5: %+v", len(reqs), reqs)
	}
	for _, r := range reqs[:4] {
		if r.Auth != "Bearer "+token {
			t.Errorf("upstream %s %s: Authorization %q, want the Bearer token", r.Method, r.Path, r.Auth)
		}
	}
	if reqs[0].Query != "page=2" {
		t.Errorf("the query string did not reach the upstream unchanged: %+v", reqs[0])
	}
	run := runtest.Run{Root: root, ID: "one"}
	es := run.Journal(t)
	acts := events(es, "action")
	if len(acts) != 5 {
		t.Fatalf("journal has %d actions, want 5", len(acts))
	}
	for _, a := range acts {
		if field(a, "decision") != "accepted" || !strings.HasPrefix(field(a, "channel"), "http:") || strings.Contains(field(a, "target"), "?") {
			t.Errorf("action: %v", a.Fields)
		}
	}
	if n := len(events(es, "action_end")); n != 5 {
		t.Errorf("%d action_end events, want 5", n)
	}
	rec := run.MustStatus(t)
	if gw, ok := rec.HTTP["gh"]; !ok || !strings.HasPrefix(gw.URL, "http://127.0.0.1:") || gw.Upstream != up.base()+"/api" || strings.Join(gw.Methods, ",") != "GET,HEAD" {
		t.Errorf("status.json http: %+v", rec.HTTP)
	}
	for _, secret := range []string{token, envToken} {
		grepTree(t, run.Dir(), []byte(secret))
	}
}

// 4. A same-user process outside the run, with the port from status.json,
// is refused (403, journaled) and the upstream sees nothing; so is another
// user.
func TestOutsiderRefused(t *testing.T) {
	up := newUpstream(t, nil)
	_, file := newSecret(t)
	root := runtest.NewRoot(t)
	c := runtest.Start(t, root, "run", "--lease", "2m",
		"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+file, "--http-ca", "gh="+up.caFile,
		"out", "--", "sleep", "300")
	run := runtest.Run{Root: root, ID: "out"}
	rec := run.WaitState(t, statusfile.Running)
	gw := rec.HTTP["gh"]
	t.Cleanup(run.Kill)

	// This test process: same user, not of the run.
	resp, err := http.Get(gw.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("X-Agent-Wrap-Decision") != "refused" {
		t.Errorf("outsider: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil || m["decision"] != "refused" || m["run_id"] != "out" ||
		(m["reason"] != "not_in_run" && m["reason"] != "caller_unknown") || m["seq"] == nil {
		t.Errorf("refusal body: %s", body)
	}
	// Over the unix socket too.
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", gw.Socket)
	}}}
	resp, err = uc.Get("http://gateway/y")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(body), `"not_in_run"`) {
		t.Errorf("outsider on the socket: %d %s", resp.StatusCode, body)
	}
	// Another user: curl as nobody.
	out, err := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		"curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", gw.URL+"/z").CombinedOutput()
	if err != nil || string(out) != "403" {
		t.Errorf("another user: %s, %v; want 403", out, err)
	}
	if reqs := up.requests(); len(reqs) != 0 {
		t.Errorf("the upstream saw outsiders' requests: %+v", reqs)
	}
	es := run.Journal(t)
	var reasons []string
	for _, a := range events(es, "action") {
		reasons = append(reasons, field(a, "decision")+":"+field(a, "reason"))
	}
	want := 3
	if len(reasons) != want || reasons[2] != "refused:other_user" {
		t.Errorf("journaled decisions %v; want three refusals, the last other_user", reasons)
	}
	if code, _, stderr := aw(t, root, "cancel", "--wait", "30s", "out"); code != 0 {
		t.Fatalf("cancel: %d %s", code, stderr)
	}
	c.Wait(t)
}

// 5. Outside the prefix (raw .., %2e%2e, %2f), a method not allowed and an
// Upgrade are refused and never reach the upstream; a redirect to another
// host is passed to the client, not followed; one inside the prefix is
// rewritten to the gateway.
func TestPathMethodUpgradeRedirect(t *testing.T) {
	up := newUpstream(t, nil)
	_, file := newSecret(t)
	root := runtest.NewRoot(t)
	job := `g=$AGENT_WRAP_HTTP_GH
code() { curl -sS --path-as-is -o /dev/null -w "%{http_code} %{redirect_url}\n" "$@"; }
echo "dotdot $(code "$g/a/../../etc/passwd")"
echo "enc $(code "$g/%2e%2e/x")"
echo "slash $(code "$g/a%2fb")"
echo "back $(code "$g/a%5cb")"
echo "post $(code -X POST -d x "$g/p")"
echo "upgrade $(code -H "Connection: Upgrade" -H "Upgrade: websocket" "$g/ws")"
echo "h2c $(code --http2 "$g/h2")"
echo "out $(code "$g/redirect-out")"
echo "in $(code "$g/redirect-in")"
echo "inner $(code "$g/a/./b/../c")"
`
	c := runtest.Start(t, root, "run", "--lease", "2m",
		"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+file, "--http-ca", "gh="+up.caFile,
		"paths", "--", "sh", "-c", job)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("exit %d: %s", code, c.Stderr.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(c.Stdout.String()), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = strings.TrimSpace(v)
	}
	for _, k := range []string{"dotdot", "enc", "slash", "back", "post", "upgrade", "h2c"} {
		if !strings.HasPrefix(got[k], "403") {
			t.Errorf("%s: %q, want 403", k, got[k])
		}
	}
	if got["out"] != "302 https://elsewhere.invalid/steal" {
		t.Errorf("redirect out: %q, want the Location as it was", got["out"])
	}
	if !strings.HasPrefix(got["in"], "302 http://127.0.0.1:") || !strings.HasSuffix(got["in"], "/landed?x=1") {
		t.Errorf("redirect in: %q, want it rewritten to the gateway's base", got["in"])
	}
	if !strings.HasPrefix(got["inner"], "200") {
		t.Errorf("a path that stays inside: %q", got["inner"])
	}
	var paths []string
	for _, r := range up.requests() {
		paths = append(paths, r.Method+" "+r.Path)
	}
	if strings.Join(paths, ",") != "GET /api/redirect-out,GET /api/redirect-in,GET /api/a/c" {
		t.Errorf("upstream saw %v; want only the redirects' and the inner path's", paths)
	}
	run := runtest.Run{Root: root, ID: "paths"}
	var reasons []string
	for _, a := range events(run.Journal(t), "action") {
		reasons = append(reasons, field(a, "reason"))
	}
	want := "outside_prefix,outside_prefix,outside_prefix,outside_prefix,method_not_allowed,upgrade_refused,upgrade_refused,running,running,running"
	if strings.Join(reasons, ",") != want {
		t.Errorf("journaled reasons\n %s\nwant\n %s", strings.Join(reasons, ","), want)
	}
}

// orphan ignores TERM, leaves the run's session, and asks the gateway for
// BASE/orphan every 50 ms, logging CLOCK_BOOTTIME (the journal's mono_ns)
// and what became of each try, until it is killed.
const orphan = `
import os, signal, sys, time, urllib.request, urllib.error
signal.signal(signal.SIGTERM, signal.SIG_IGN)
base, log = sys.argv[1], open(sys.argv[2], "a", buffering=1)
while True:
    t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    try:
        urllib.request.urlopen(base + "/orphan", timeout=5).read()
        what = "ok"
    except urllib.error.HTTPError as e:
        what = "http %d" % e.code
    except urllib.error.URLError as e:
        what = "refused" if isinstance(e.reason, ConnectionRefusedError) else "error %r" % (e.reason,)
    except Exception as e:
        what = "error %r" % (e,)
    log.write("%d %s\n" % (t, what))
    time.sleep(0.05)
`

// 3. An orphan that kept the URL (it ignores TERM and left the session):
// after a cancel, and separately after the lease passes, its connects are
// refused and the upstream sees nothing more; the request in flight at that
// moment (a slow response) is cut and listed in authority_revoked.cut.
func TestRevokedAtTheIntent(t *testing.T) {
	for _, how := range []string{"cancel", "lease"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, nil)
			_, file := newSecret(t)
			root := runtest.NewRoot(t)
			py := writeScript(t, "orphan.py", orphan)
			log := filepath.Join(t.TempDir(), "orphan.log")
			job := fmt.Sprintf(`setsid -f %s %s "$AGENT_WRAP_HTTP_GH" %s
exec curl -sS -N "$AGENT_WRAP_HTTP_GH/slow"`, python, py, log)
			id := "cut-" + how
			c := runtest.Start(t, root, "run", "--lease", "2m", "--grace", "3s",
				"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+file, "--http-ca", "gh="+up.caFile,
				id, "--", "sh", "-c", job)
			run := runtest.Run{Root: root, ID: id}
			t.Cleanup(run.Kill)
			select {
			case <-up.started:
			case <-time.After(runtest.Patience):
				t.Fatalf("the slow request never reached the upstream; stderr: %s", c.Stderr.String())
			}
			waitFor(t, "the orphan's first accepted request", func() bool {
				b, _ := os.ReadFile(log)
				return strings.Contains(string(b), " ok\n")
			})
			if how == "cancel" {
				if code, _, stderr := aw(t, root, "cancel", id); code != 0 {
					t.Fatalf("cancel: %d %s", code, stderr)
				}
			} else if code, _, stderr := aw(t, root, "renew", "--lease", "1s", id); code != 0 {
				t.Fatalf("renew: %d %s", code, stderr)
			}
			c.Wait(t)
			run.AssertGroupEmpty(t)

			es := run.Journal(t)
			var revoked *journal.Entry
			for i := range es {
				if es[i].Event == "authority_revoked" && field(es[i], "channel") == "http:gh" {
					revoked = &es[i]
				}
			}
			if revoked == nil {
				t.Fatalf("no authority_revoked for http:gh: %v", run.Events(t))
			}
			intent := "cancel_requested"
			if how == "lease" {
				intent = "deadline_expired"
			}
			var intentSeq int64
			for _, e := range es {
				if e.Event == intent {
					intentSeq = e.Seq
				}
			}
			if intentSeq == 0 || intentSeq > revoked.Seq {
				t.Fatalf("%s at %d, authority_revoked at %d: %v", intent, intentSeq, revoked.Seq, run.Events(t))
			}
			// The slow request was in flight: accepted, then cut.
			var slow int64
			for _, a := range events(es, "action") {
				if strings.HasSuffix(field(a, "target"), "/api/slow") && field(a, "decision") == "accepted" {
					slow = a.Seq
				}
				if a.Seq > intentSeq && field(a, "decision") == "accepted" {
					t.Errorf("action %d accepted after the intent (%d)", a.Seq, intentSeq)
				}
			}
			if cut := field(*revoked, "cut"); cut != fmt.Sprintf("[%d]", slow) {
				t.Errorf("authority_revoked cut %s; want [%d], the slow request", cut, slow)
			}
			ended := false
			for _, e := range events(es, "action_end") {
				if field(e, "action") == fmt.Sprint(slow) {
					ended = field(e, "cut") == "true" && e.Seq < revoked.Seq
				}
			}
			if !ended {
				t.Errorf("the slow request %d has no action_end with cut true before the revocation", slow)
			}
			// The orphan: nothing accepted after the revocation, and it tried.
			b, _ := os.ReadFile(log)
			after := 0
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				var at int64
				var what string
				fmt.Sscanf(line, "%d", &at)
				_, what, _ = strings.Cut(line, " ")
				if at <= revoked.MonoNS {
					continue
				}
				after++
				if what != "refused" {
					t.Errorf("the orphan's try after the revocation: %q, want refused", line)
				}
			}
			if after == 0 {
				t.Errorf("the orphan made no try after the revocation (grace 3s):\n%s", b)
			}
			t.Logf("%s at seq %d, authority_revoked at %d cut %s; the orphan tried %d times after it, all refused",
				intent, intentSeq, revoked.Seq, field(*revoked, "cut"), after)
			for _, r := range up.requests() {
				if r.At > revoked.MonoNS {
					t.Errorf("the upstream saw %s %s after the revocation", r.Method, r.Path)
				}
			}
		})
	}
}
