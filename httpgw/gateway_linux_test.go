package httpgw_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// curl and Python's urllib, through the TCP base and the unix socket:
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

// A same-user process outside the run, with the port from status.json,
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

// Outside the prefix (raw .., %2e%2e, %2f), a method not allowed and an
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

// An orphan that kept the URL (it ignores TERM and left the session):
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

// hammer asks the gateway on 8 keep-alive connections, as fast as it
// answers, until it refuses connections (or 5000 tries), and prints how the
// tries ended.
const hammer = `
import http.client, os, sys, threading, collections
host, port = sys.argv[1].split("//")[1].split(":")
got, lock = collections.Counter(), threading.Lock()
def worker(n):
    conn, refused = None, 0
    for i in range(700):
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("GET", "/h/%d/%d" % (n, i))
            r = conn.getresponse(); r.read()
            what = str(r.status)
            refused = 0
        except ConnectionRefusedError:
            what, conn = "refused", None
            refused += 1
            if refused >= 3:
                break
        except Exception as e:
            what, conn = type(e).__name__, None
        with lock:
            got[what] += 1
ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(dict(got))
`

// Requests racing a lease's end: no accepted action is journaled after
// deadline_expired, and every accepted one has its action_end.
func TestRequestsRacingLeaseEnd(t *testing.T) {
	up := newUpstream(t, nil)
	_, file := newSecret(t)
	root := runtest.NewRoot(t)
	py := writeScript(t, "hammer.py", hammer)
	c := runtest.Start(t, root, "run", "--lease", "2m", "--grace", "2s",
		"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+file, "--http-ca", "gh="+up.caFile,
		"race", "--", "sh", "-c", "exec "+python+" "+py+` "$AGENT_WRAP_HTTP_GH"`)
	run := runtest.Run{Root: root, ID: "race"}
	t.Cleanup(run.Kill)
	waitFor(t, "200 requests at the upstream", func() bool { return len(up.requests()) >= 200 })
	if code, _, stderr := aw(t, root, "renew", "--lease", "1s", "race"); code != 0 {
		t.Fatalf("renew: %d %s", code, stderr)
	}
	if code := c.Wait(t); code != 124 {
		t.Errorf("exit %d, want 124 (lease expired); stderr: %s", code, c.Stderr.String())
	}
	run.AssertGroupEmpty(t)
	es := run.Journal(t)
	var expired int64
	for _, e := range es {
		if e.Event == "deadline_expired" {
			expired = e.Seq
		}
	}
	if expired == 0 {
		t.Fatalf("no deadline_expired: %v", run.Events(t)[len(es)-8:])
	}
	accepted, refused, lateRefused := map[string]bool{}, 0, 0
	for _, a := range events(es, "action") {
		switch field(a, "decision") {
		case "accepted":
			accepted[fmt.Sprint(a.Seq)] = true
			if a.Seq > expired {
				t.Errorf("action %d accepted after deadline_expired (%d)", a.Seq, expired)
			}
		default:
			refused++
			if a.Seq > expired {
				lateRefused++
			}
		}
	}
	for _, e := range events(es, "action_end") {
		if !accepted[field(e, "action")] {
			t.Errorf("action_end for %s, which is not an accepted action", field(e, "action"))
		}
		delete(accepted, field(e, "action"))
	}
	if len(accepted) > 0 {
		t.Errorf("accepted actions without an action_end: %v", accepted)
	}
	t.Logf("%d requests reached the upstream; deadline_expired at seq %d; %d refused (%d after it)",
		len(up.requests()), expired, refused, lateRefused)
}

// peek tries, as the user it runs as, to read /proc/PID/mem and
// /proc/PID/environ of each PID and to attach to it with ptrace, and
// prints one line per PID: "PID mem=... environ=... ptrace=...".
const peek = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def tryopen(p):
    try:
        f = open(p, "rb")
    except OSError as e:
        return "refused:" + (os.strerror(e.errno) if e.errno else type(e).__name__)
    try:
        f.read(1)  # mem at offset 0 is unmapped: EIO, but it opened
    except OSError:
        pass
    f.close()
    return "open"
for pid in map(int, sys.argv[1:]):
    mem = tryopen("/proc/%d/mem" % pid)
    env = tryopen("/proc/%d/environ" % pid)
    if libc.ptrace(16, pid, None, None) == 0:
        os.waitpid(pid, 0)
        libc.ptrace(17, pid, None, None)
        pt = "attached"
    else:
        pt = "refused:" + os.strerror(ctypes.get_errno())
    print(pid, "mem=" + mem, "environ=" + env, "ptrace=" + pt)
`

// A process of the same user (not root: root's CAP_SYS_PTRACE passes
// over non-dumpable) can neither read the wrapper's memory or environment
// nor attach to it, while it can do all three to the job the wrapper
// started; the secret is in no file under the run root.
func TestWrapperNotDumpable(t *testing.T) {
	const nobody = "65534"
	up := newUpstream(t, nil)
	dir, err := os.MkdirTemp("", "aw-nodump-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	token := "tok-nodump-" + strings.TrimPrefix(filepath.Base(dir), "aw-nodump-")
	bin := filepath.Join(dir, "agent-wrap")
	mustCopy(t, runtest.Binary(t), bin, 0o755)
	mustCopy(t, up.caFile, filepath.Join(dir, "ca.pem"), 0o644)
	secret := filepath.Join(dir, "token")
	if err := os.WriteFile(secret, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "peek.py")
	mustCopyBytes(t, []byte(peek), script, 0o755)
	for _, p := range []string{dir, secret} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(dir, 0o755)
	root := filepath.Join(dir, "runs")
	as := []string{"setpriv", "--reuid", nobody, "--regid", nobody, "--clear-groups", "--"}
	wr := exec.Command(as[0], append(as[1:], bin, "--root", root, "run", "--lease", "2m", "--cgroup", "off",
		"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+secret, "--http-ca", "gh="+filepath.Join(dir, "ca.pem"),
		"nd", "--", "sleep", "300")...)
	wr.Env = []string{"PATH=/usr/bin:/bin", "SECRET_IN_ENV_MARKER=1"}
	var stderr runtest.Buffer
	wr.Stderr = &stderr
	wr.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	if err := wr.Start(); err != nil {
		t.Fatal(err)
	}
	run := runtest.Run{Root: root, ID: "nd"}
	t.Cleanup(func() {
		run.Kill()
		wr.Process.Kill()
		wr.Wait()
	})
	rec := run.WaitState(t, statusfile.Running)
	out, err := exec.Command(as[0], append(as[1:], python, script, fmt.Sprint(rec.WrapperPID), fmt.Sprint(rec.PID))...).CombinedOutput()
	if err != nil {
		t.Fatalf("peek: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("peek: %s", out)
	}
	t.Logf("as uid %s:\n  wrapper %s\n  job     %s", nobody, lines[0], lines[1])
	for _, what := range []string{"mem=refused", "environ=refused", "ptrace=refused"} {
		if !strings.Contains(lines[0], what) {
			t.Errorf("the wrapper (PID %d) is open to its user: %s (want %s)", rec.WrapperPID, lines[0], what)
		}
	}
	// The check can see an open process: the job is dumpable, as usual.
	for _, what := range []string{"mem=open", "environ=open", "ptrace=attached"} {
		if !strings.Contains(lines[1], what) {
			t.Errorf("the job (PID %d) should be dumpable: %s (want %s)", rec.PID, lines[1], what)
		}
	}
	if out, err := exec.Command(as[0], append(as[1:], bin, "--root", root, "cancel", "--wait", "30s", "nd")...).CombinedOutput(); err != nil {
		t.Errorf("cancel: %v %s", err, out)
	}
	wr.Wait()
	grepTree(t, root, []byte(token))
}

func mustCopy(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	mustCopyBytes(t, b, to, mode)
}

func mustCopyBytes(t *testing.T, b []byte, to string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// Real git over smart HTTP: `git http-backend` behind net/http/cgi and
// Basic auth ({basic}), through the gateway. A gateway that allows
// GET,POST clones and pushes; one left at the default (GET,HEAD) is
// refused at the first POST, and the upstream repository is unchanged.
func TestGitThroughGateway(t *testing.T) {
	const user, pass = "agent", "git-token-5f1c"
	bare := filepath.Join(t.TempDir(), "repos")
	seed := filepath.Join(t.TempDir(), "seed")
	gitRun(t, "", "init", "-q", "--bare", "--initial-branch=main", filepath.Join(bare, "p.git"))
	gitRun(t, "", "init", "-q", seed)
	os.WriteFile(filepath.Join(seed, "a"), []byte("a\n"), 0o644)
	gitRun(t, seed, "add", "a")
	gitRun(t, seed, "commit", "-qm", "seed")
	gitRun(t, seed, "push", "-q", filepath.Join(bare, "p.git"), "HEAD:refs/heads/main")
	backend := &cgi.Handler{
		Path: "/usr/lib/git-core/git-http-backend",
		Root: "/git",
		Env:  []string{"GIT_PROJECT_ROOT=" + bare, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=" + user},
	}
	auth := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})
	up := newUpstream(t, auth)
	secret := filepath.Join(t.TempDir(), "cred")
	os.WriteFile(secret, []byte(user+":"+pass+"\n"), 0o600)
	root := runtest.NewRoot(t)
	job := `set -e
export HOME=$JOBHOME GIT_TERMINAL_PROMPT=0
cd "$HOME"
git config --global user.email a@b.c; git config --global user.name job
git config --global http.receivepack true
git clone -q "$AGENT_WRAP_HTTP_RW/p.git" w
cd w; echo b >b; git add b; git commit -qm job
git push -q origin HEAD:refs/heads/main && echo pushed-rw
echo c >c; git add c; git commit -qm job2
if git push -q "$AGENT_WRAP_HTTP_RO/p.git" HEAD:refs/heads/main 2>err; then echo pushed-ro; else echo refused-ro; cat err; fi
`
	gw := func(name, allow string) []string {
		a := []string{"--http", name + "=" + up.base() + "/git", "--http-secret", name + "=file:" + secret,
			"--http-header", name + "=Authorization: Basic {basic}", "--http-ca", name + "=" + up.caFile}
		if allow != "" {
			a = append(a, "--http-allow", name+"="+allow)
		}
		return a
	}
	args := append([]string{"run", "--lease", "2m"}, gw("rw", "GET,POST")...)
	args = append(args, gw("ro", "")...)
	args = append(args, "git", "--", "sh", "-c", job)
	home := t.TempDir()
	c := runtest.StartWith(t, root, func(c *exec.Cmd) { c.Env = append(c.Env, "JOBHOME="+home) }, args...)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, c.Stdout.String(), c.Stderr.String())
	}
	out := c.Stdout.String()
	if !strings.Contains(out, "pushed-rw") || !strings.Contains(out, "refused-ro") || !strings.Contains(out, "403") {
		t.Errorf("job output:\n%s", out)
	}
	log := gitRun(t, filepath.Join(bare, "p.git"), "log", "--format=%s", "main")
	if log != "job\nseed" {
		t.Errorf("upstream main is %q; want the rw push and not the ro one", log)
	}
	for _, r := range up.requests() {
		if want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)); r.Auth != want {
			t.Errorf("upstream %s %s: Authorization %q", r.Method, r.Path, r.Auth)
		}
	}
	run := runtest.Run{Root: root, ID: "git"}
	refused := 0
	for _, a := range events(run.Journal(t), "action") {
		if field(a, "channel") == "http:ro" && field(a, "reason") == "method_not_allowed" && field(a, "request") == "POST" {
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("no POST refused as method_not_allowed on http:ro")
	}
	grepTree(t, run.Dir(), []byte(pass))
}

func gitRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir(),
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// What the upstream has sent of a response reaches the job while the rest
// is still to come, with a length (gathered into larger writes between the
// proxy's flushes) and without one (streamed, write by write); and the
// whole body arrives once the upstream sends the rest.
func TestPartialBodyPassesOn(t *testing.T) {
	up := newUpstream(t, nil)
	_, file := newSecret(t)
	root := runtest.NewRoot(t)
	dir := t.TempDir()
	job := fmt.Sprintf(`curl -sS -N "$AGENT_WRAP_HTTP_GH/slow" > %[1]s/streamed &
curl -sS -N "$AGENT_WRAP_HTTP_GH/slow-sized" > %[1]s/sized &
wait`, dir)
	c := runtest.Start(t, root, "run", "--lease", "2m",
		"--http", "gh="+up.base()+"/api", "--http-secret", "gh=file:"+file, "--http-ca", "gh="+up.caFile,
		"partial", "--", "sh", "-c", job)
	t.Cleanup(runtest.Run{Root: root, ID: "partial"}.Kill)
	for _, name := range []string{"streamed", "sized"} {
		waitFor(t, "the first part of the "+name+" body at the job, the rest still held by the upstream", func() bool {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			return string(b) == "first\n"
		})
	}
	close(up.slow)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("run: exit %d\nstderr: %s", code, c.Stderr.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sized")); string(b) != "first\nlater\n" {
		t.Errorf("the sized body at the job: %q, want %q", b, "first\nlater\n")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "streamed")); string(b) != "first\n" {
		t.Errorf("the streamed body at the job: %q, want %q", b, "first\n")
	}
}
