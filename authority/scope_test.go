package authority_test

// End-to-end tests of "Authority ends with the run": the real binary, a real
// ssh-agent holding a real ed25519 key loaded by ssh-add, the loopback sshd
// of internal/sshtest, real git. Processes are stopped by recorded PID and
// process group, never by name.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/internal/agenttest"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// TestMain lets the test binary serve as a job's helper: with
// AUTHTEST_HANDOFF=PATH it connects to $SSH_AUTH_SOCK, sends that
// connection over the unix socket at PATH (SCM_RIGHTS) to a process
// outside the run, prints "sent" and waits to be stopped.
func TestMain(m *testing.M) {
	if path := os.Getenv("AUTHTEST_HANDOFF"); path != "" {
		os.Exit(handoff(path))
	}
	if os.Getenv("AUTHTEST_SPAM") != "" {
		spam()
	}
	os.Exit(m.Run())
}

func handoff(path string) int {
	c, err := net.Dial("unix", os.Getenv("SSH_AUTH_SOCK"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, _ := c.(*net.UnixConn).File()
	to, err := net.Dial("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, _, err := to.(*net.UnixConn).WriteMsgUnix([]byte{0}, unix.UnixRights(int(f.Fd())), nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("sent")
	// A process of the run, holding its end, until the run stops it. (A
	// bare select{} would be a deadlock the runtime kills, exit 2.)
	for {
		time.Sleep(time.Hour)
	}
}

// spam lists the agent's keys through $SSH_AUTH_SOCK as fast as it can,
// on two connections, dialling again whenever one fails, until it is
// stopped.
func spam() {
	for {
		c, err := net.Dial("unix", os.Getenv("SSH_AUTH_SOCK"))
		if err != nil {
			continue
		}
		a := agent.NewClient(c)
		for {
			if _, err := a.List(); err != nil {
				break
			}
		}
		c.Close()
	}
}

// receive accepts one connection on ln and returns the descriptor sent on
// it as a net.Conn.
func receive(t *testing.T, ln *net.UnixListener) net.Conn {
	t.Helper()
	_ = ln.SetDeadline(time.Now().Add(runtest.Patience))
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatalf("no handoff: %v", err)
	}
	defer c.Close()
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v: %v", msgs, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v: %v", fds, err)
	}
	nc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "handed"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// run starts `agent-wrap run ARGS` with SSH_AUTH_SOCK=sock ("" unset) and
// the binary's directory first in PATH.
func run(t *testing.T, root, sock string, args ...string) (*runtest.Cmd, runtest.Run) {
	t.Helper()
	setAuthSock(t, sock)
	id := ""
	for i, a := range args {
		if a == "--" {
			id = args[i-1]
			break
		}
	}
	r := runtest.Run{Root: root, ID: id}
	t.Cleanup(r.Kill)
	return runtest.Start(t, root, append([]string{"run"}, args...)...), r
}

func setAuthSock(t *testing.T, sock string) {
	t.Setenv("SSH_AUTH_SOCK", sock)
	if sock == "" {
		os.Unsetenv("SSH_AUTH_SOCK")
	}
	t.Setenv("PATH", filepath.Dir(runtest.Binary(t))+":"+os.Getenv("PATH"))
}

// actions returns the run's action events.
func actions(es []journal.Entry) []journal.Entry {
	var out []journal.Entry
	for _, e := range es {
		if e.Event == authority.EventAction {
			out = append(out, e)
		}
	}
	return out
}

func field(e journal.Entry, k string) string {
	switch v := e.Fields[k].(type) {
	case nil:
		return ""
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case json.Number:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}

func seqOf(es []journal.Entry, event string) int64 {
	for _, e := range es {
		if e.Event == event {
			return e.Seq
		}
	}
	return -1
}

// assertRevokedInOrder checks intent < authority_revoked < first signal.
func assertRevokedInOrder(t *testing.T, es []journal.Entry, intent string) {
	t.Helper()
	i, r, s := seqOf(es, intent), seqOf(es, "authority_revoked"), seqOf(es, "signal_sent")
	if i < 0 || r < 0 || s < 0 || !(i < r && r < s) {
		t.Fatalf("want %s (%d) < authority_revoked (%d) < signal_sent (%d)", intent, i, r, s)
	}
	for _, e := range actions(es) {
		if e.Seq > r && field(e, "channel") == authority.ChannelSSHAgent {
			t.Fatalf("agent action %d journaled after authority_revoked (%d)", e.Seq, r)
		}
	}
}

// assertNoAcceptedAfterIntent is the audit question: did any action start
// after deadline_expired or cancel_requested? It must be no.
func assertNoAcceptedAfterIntent(t *testing.T, es []journal.Entry) {
	t.Helper()
	intent := int64(-1)
	for _, e := range es {
		if (e.Event == "deadline_expired" || e.Event == "cancel_requested") && intent < 0 {
			intent = e.Seq
		}
		if e.Event == authority.EventAction && intent >= 0 && field(e, "decision") == authority.Accepted {
			t.Fatalf("action %d accepted after the intent at seq %d", e.Seq, intent)
		}
	}
}

// allowedActionFields is everything an action event may hold: nothing
// secret (no key blob, no data, no session ID, no environment).
var allowedActionFields = map[string]bool{"channel": true, "request": true, "key": true, "target": true,
	"caller_pid": true, "caller_start": true, "decision": true, "reason": true}

func assertNothingSecret(t *testing.T, r runtest.Run, secrets ...string) {
	t.Helper()
	for _, e := range actions(r.Journal(t)) {
		for k := range e.Fields {
			if !allowedActionFields[k] {
				t.Errorf("action %d has field %q", e.Seq, k)
			}
		}
	}
	raw := r.File("events.jsonl")
	for _, s := range secrets {
		if s != "" && strings.Contains(raw, s) {
			t.Errorf("the journal holds %q", s)
		}
	}
}

// Inside a run, ssh-add -l lists the key through the relay and a
// BatchMode ssh login with it succeeds; ssh-add -D and adding a key are
// refused; every request is one action event, with nothing secret.
func TestScopedAgentLoginAndRefusals(t *testing.T) {
	a := agenttest.Start(t)
	srv := sshtest.Start(t)
	a.Add(t, srv.Key())
	other := filepath.Join(t.TempDir(), "other")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	userFP := agenttest.Fingerprint(t, srv.Key()+".pub")
	root := runtest.NewRoot(t)
	login := sshtest.Quote("ssh", "-F", "/dev/null", "-p", strconv.Itoa(srv.Port()), "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
		srv.Destination(), "echo logged-in-$((6*7))")
	script := `echo "sock=$SSH_AUTH_SOCK id=$AGENT_WRAP_RUN_ID"; ssh-add -l; ` + login + `; echo login=$?; ` +
		`ssh-add -D; echo delete=$?; ssh-add ` + other + `; echo add=$?; ssh-add -l | grep -c SHA256`
	c, r := run(t, root, a.Sock, "--lease", "5m", "s1", "--", "sh", "-c", script)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, c.Stdout.String(), c.Stderr.String())
	}
	out := c.Stdout.String()
	rec := r.MustStatus(t)
	sock := filepath.Join(r.Dir(), "agent.sock")
	for _, want := range []string{"sock=" + sock + " id=s1", a.Fingerprint, userFP, "logged-in-42", "login=0", "delete=1", "add=1", "\n2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr: %s", want, out, c.Stderr.String())
		}
	}
	if rec.AgentSocket != sock {
		t.Errorf("agent_socket %q, want %q", rec.AgentSocket, sock)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after the run: %v", err)
	}
	// The agent itself still holds its two keys.
	cmd := exec.Command("ssh-add", "-l")
	cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+a.Sock)
	if b, _ := cmd.Output(); strings.Count(string(b), "SHA256:") != 2 {
		t.Errorf("the agent's keys changed:\n%s", b)
	}

	es := r.Journal(t)
	count := map[string]int{}
	var signedWith []string
	for _, e := range actions(es) {
		req, dec := field(e, "request"), field(e, "decision")
		count[req+" "+dec]++
		if field(e, "channel") != authority.ChannelSSHAgent || field(e, "caller_pid") == "" || field(e, "caller_start") == "" {
			t.Errorf("action %d: %s", e.Seq, e.Fields)
		}
		if req == "sign" {
			signedWith = append(signedWith, field(e, "key"))
		}
	}
	t.Logf("actions: %v", count)
	// ssh-add -l twice and ssh once list; ssh signs once with the key that
	// logs in (and may first bind the session); -D is 19 (and 9), the add 17.
	if count["identities accepted"] < 3 || count["sign accepted"] < 1 || count["19 refused"] != 1 || count["17 refused"] != 1 {
		t.Errorf("actions %v", count)
	}
	for k, n := range count {
		if strings.HasSuffix(k, " refused") && k != "19 refused" && k != "9 refused" && k != "17 refused" {
			t.Errorf("unexpected refusal %q (%d)", k, n)
		}
	}
	for _, fp := range signedWith {
		if fp != userFP {
			t.Errorf("signed with %q, want %q", fp, userFP)
		}
	}
	key, _ := os.ReadFile(srv.Key())
	pub, _ := os.ReadFile(srv.Key() + ".pub")
	assertNothingSecret(t, r, strings.TrimSpace(string(key)), strings.Fields(string(pub))[1])
	if seqOf(es, "authority_revoked") < seqOf(es, "leader_exited") {
		t.Errorf("authority_revoked before the leader exited: %v", r.Events(t))
	}
}

// A process of the run hands its relay connection to a process outside
// (SCM_RIGHTS). While the run lives the descriptor works (the relay asks
// about the process that connected); after a cancel, and separately after
// the lease passes, a request on it fails and the socket path is gone.
func TestHandedOffConnectionDiesWithTheRun(t *testing.T) {
	a := agenttest.Start(t)
	for _, end := range []string{"cancel", "lease"} {
		t.Run(end, func(t *testing.T) {
			root := runtest.NewRoot(t)
			hand := filepath.Join(t.TempDir(), "handoff.sock")
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: hand, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			t.Setenv("AUTHTEST_HANDOFF", hand)
			id := "h-" + end
			c, r := run(t, root, a.Sock, "--lease", "5m", "--grace", "10s", id, "--", os.Args[0])
			nc := receive(t, ln)
			client := agent.NewClient(nc)
			keys, err := client.List()
			if err != nil || len(keys) != 1 {
				t.Fatalf("list on the handed descriptor while the run lives: %v %v", keys, err)
			}
			rec := r.WaitState(t, statusfile.Running)

			switch end {
			case "cancel":
				if code, _, stderr := runtest.Exec(t, root, "cancel", id); code != 0 {
					t.Fatalf("cancel: %d %s", code, stderr)
				}
			case "lease":
				if code, _, stderr := runtest.Exec(t, root, "renew", "--lease", "1s", id); code != 0 {
					t.Fatalf("renew: %d %s", code, stderr)
				}
				r.WaitState(t, statusfile.Cancelled)
			}
			c.Wait(t)
			if _, err := client.Sign(keys[0], []byte("after the run")); err == nil {
				t.Fatal("sign on the handed descriptor succeeded after the run ended")
			}
			if _, err := os.Lstat(rec.AgentSocket); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("socket %s still there: %v", rec.AgentSocket, err)
			}
			es := r.Journal(t)
			intent := map[string]string{"cancel": "cancel_requested", "lease": "deadline_expired"}[end]
			assertRevokedInOrder(t, es, intent)
			assertNoAcceptedAfterIntent(t, es)
			if n := len(actions(es)); n != 1 {
				t.Fatalf("%d actions, want the one list: %v", n, r.Events(t))
			}
		})
	}
}

// A same-user process outside the run (a shell of the user, and a job
// of another run) connecting to the socket while the run lives is refused,
// and the refusal is journaled with its PID.
func TestOutsiderRefused(t *testing.T) {
	a := agenttest.Start(t)
	root := runtest.NewRoot(t)
	_, r := run(t, root, a.Sock, "--lease", "5m", "own", "--", "sleep", "300")
	rec := r.WaitState(t, statusfile.Running)

	// A shell of the user.
	sh := exec.Command("sh", "-c", "ssh-add -l; echo rc=$?")
	sh.Env = append(os.Environ(), "SSH_AUTH_SOCK="+rec.AgentSocket)
	out, _ := sh.CombinedOutput()
	if !strings.Contains(string(out), "rc=1") || strings.Contains(string(out), a.Fingerprint) {
		t.Fatalf("an outside shell used the run's agent:\n%s", out)
	}
	// A job of another run, pointed at this run's socket.
	c2, r2 := run(t, root, a.Sock, "--lease", "5m", "other", "--", "sh", "-c", "SSH_AUTH_SOCK="+rec.AgentSocket+" ssh-add -l; echo rc=$?")
	c2.Wait(t)
	if out := c2.Stdout.String(); !strings.Contains(out, "rc=1") || strings.Contains(out, a.Fingerprint) {
		t.Fatalf("another run's job used this run's agent:\n%s", out)
	}
	acts := actions(r.Journal(t))
	if len(acts) != 2 {
		t.Fatalf("%d actions, want 2: %v", len(acts), acts)
	}
	for _, e := range acts {
		if field(e, "decision") != authority.Refused || field(e, "reason") != authority.ReasonNotMember {
			t.Errorf("action %d: %s", e.Seq, e.Fields)
		}
	}
	if n := len(actions(r2.Journal(t))); n != 0 {
		t.Errorf("the other run journaled %d actions", n)
	}
	if code, _, _ := runtest.Exec(t, root, "cancel", "own"); code != 0 {
		t.Fatal("cancel failed")
	}
}

// authorize runs `agent-wrap authorize ARGS` and decodes its line.
func authorize(t *testing.T, root string, args ...string) (int, authority.Decision) {
	t.Helper()
	code, out, stderr := runtest.Exec(t, root, append([]string{"authorize"}, args...)...)
	var d authority.Decision
	if err := json.Unmarshal([]byte(out), &d); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("authorize %v: exit %d, not one JSON line: %q (%v)\n%s", args, code, out, err, stderr)
	}
	return code, d
}

// A job that ignores TERM, so its processes outlive the intent for as
// long as the grace lasts: the window in which authority must be refused.
const stubborn = `trap '' TERM; sleep 300 & while :; do wait; done`

// authorize: accepted for a job's process while the run lives; refused
// after the lease passed and after a cancel; 66 for a process of no run,
// with nothing journaled.
func TestAuthorize(t *testing.T) {
	root := runtest.NewRoot(t)
	setAuthSock(t, "")
	for _, end := range []string{"cancel", "lease"} {
		t.Run(end, func(t *testing.T) {
			id := "az-" + end
			_, r := run(t, root, "", "--lease", "5m", "--grace", "60s", id, "--", "sh", "-c", stubborn)
			rec := r.WaitState(t, statusfile.Running)
			pid := strconv.Itoa(rec.PID)
			code, d := authorize(t, root, "--pid", pid, "--channel", "broker", "--target", "api.example.com")
			if code != 0 || d.Decision != authority.Accepted || d.RunID != id || d.Seq == 0 || d.DeadlineEpoch == 0 {
				t.Fatalf("while running: exit %d %+v", code, d)
			}
			switch end {
			case "cancel":
				// --wait short: the job ignores TERM, so the run stays cancelling.
				runtest.Exec(t, root, "cancel", "--wait", "0.1s", id)
			case "lease":
				if code, _, stderr := runtest.Exec(t, root, "renew", "--lease", "1s", id); code != 0 {
					t.Fatalf("renew: %s", stderr)
				}
			}
			r.WaitState(t, statusfile.Cancelling)
			code, d = authorize(t, root, "--pid", pid, "--channel", "broker")
			if code != 1 || d.Decision != authority.Refused || d.Reason != authority.ReasonIntent {
				t.Fatalf("after %s: exit %d %+v", end, code, d)
			}
			es := r.Journal(t)
			assertNoAcceptedAfterIntent(t, es)
			acts := actions(es)
			if len(acts) != 2 || field(acts[0], "target") != "api.example.com" || field(acts[0], "channel") != "broker" ||
				field(acts[0], "caller_pid") != pid || field(acts[1], "decision") != authority.Refused {
				t.Fatalf("actions %v", acts)
			}
		})
	}
	// A process of no run: 66, nothing journaled anywhere.
	before := journals(t, root)
	code, d := authorize(t, root, "--pid", strconv.Itoa(os.Getpid()))
	if code != 66 || d.Decision != authority.Refused {
		t.Fatalf("outsider: exit %d %+v", code, d)
	}
	if after := journals(t, root); after != before {
		t.Fatal("authorize for a process of no run journaled something")
	}
}

func journals(t *testing.T, root string) string {
	var b strings.Builder
	m, _ := filepath.Glob(filepath.Join(root, "*", "events.jsonl"))
	for _, p := range m {
		data, _ := os.ReadFile(p)
		b.Write(data)
	}
	return b.String()
}

// 200 authorize attempts racing a lease expiry leave no accepted
// action after deadline_expired in the journal, and every answer printed
// is the one journaled under its seq.
func TestAuthorizeRacingExpiry(t *testing.T) {
	root := runtest.NewRoot(t)
	setAuthSock(t, "")
	_, r := run(t, root, "", "--lease", "5m", "--grace", "60s", "race", "--", "sh", "-c", stubborn)
	rec := r.WaitState(t, statusfile.Running)
	pid := strconv.Itoa(rec.PID)
	bin := runtest.Binary(t)

	type answer struct {
		code int
		d    authority.Decision
	}
	const attempts, workers = 200, 4
	var mu sync.Mutex
	var answers []answer
	next := 0
	// End the lease on demand, then spread the attempts evenly over the two
	// seconds around the new deadline, so that they run across the expiry.
	// (A schedule for the race, not synchronisation: the assertions below
	// hold whatever the timing.)
	if code, _, stderr := runtest.Exec(t, root, "renew", "--lease", "2s", "race"); code != 0 {
		t.Fatalf("renew: %s", stderr)
	}
	dl, err := strconv.ParseInt(strings.TrimSpace(r.File("deadline_epoch")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Unix(dl, 0).Add(-time.Second)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				n := next
				next++
				mu.Unlock()
				if n >= attempts {
					return
				}
				time.Sleep(time.Until(first.Add(time.Duration(n) * 2 * time.Second / attempts)))
				cmd := exec.Command(bin, "--root", root, "authorize", "--pid", pid, "--channel", "race")
				out, _ := cmd.Output()
				var d authority.Decision
				_ = json.Unmarshal(out, &d)
				mu.Lock()
				answers = append(answers, answer{cmd.ProcessState.ExitCode(), d})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.WaitState(t, statusfile.Cancelling)

	es := r.Journal(t)
	assertNoAcceptedAfterIntent(t, es)
	bySeq := map[int64]journal.Entry{}
	for _, e := range es {
		bySeq[e.Seq] = e
	}
	accepted, refused := 0, 0
	for _, a := range answers {
		e, ok := bySeq[a.d.Seq]
		if !ok || e.Event != authority.EventAction || field(e, "decision") != a.d.Decision {
			t.Fatalf("answer %+v (exit %d) is not what the journal holds at seq %d: %v", a.d, a.code, a.d.Seq, e)
		}
		switch {
		case a.d.Decision == authority.Accepted && a.code == 0:
			accepted++
		case a.d.Decision == authority.Refused && a.code == 1:
			refused++
		default:
			t.Fatalf("answer %+v with exit %d", a.d, a.code)
		}
	}
	t.Logf("%d attempts: %d accepted, %d refused; deadline_expired at seq %d", len(answers), accepted, refused, seqOf(es, "deadline_expired"))
	if len(answers) != attempts || accepted == 0 || refused == 0 {
		// All on one side of the expiry: the race did not happen, so say
		// so rather than pass.
		t.Fatalf("%d answers, %d accepted, %d refused: the attempts did not span the expiry", len(answers), accepted, refused)
	}
}

// --agent inherit passes SSH_AUTH_SOCK on untouched (journaled once);
// --agent none removes it; a run with no SSH_AUTH_SOCK gets no relay. Every
// job gets AGENT_WRAP_RUN_ID.
func TestAgentModes(t *testing.T) {
	a := agenttest.Start(t)
	root := runtest.NewRoot(t)
	show := `echo "sock=${SSH_AUTH_SOCK-unset} id=$AGENT_WRAP_RUN_ID"`
	for _, c := range []struct {
		id, sock, flag, want, event string
	}{
		{"m-inherit", a.Sock, "inherit", "sock=" + a.Sock + " id=m-inherit", "agent_inherited"},
		{"m-none", a.Sock, "none", "sock=unset id=m-none", ""},
		{"m-nosock", "", "", "sock=unset id=m-nosock", ""},
		{"m-nosock-scoped", "", "scoped", "sock=unset id=m-nosock-scoped", ""},
	} {
		t.Run(c.id, func(t *testing.T) {
			args := []string{"--lease", "5m"}
			if c.flag != "" {
				args = append(args, "--agent", c.flag)
			}
			cmd, r := run(t, root, c.sock, append(args, c.id, "--", "sh", "-c", show)...)
			if code := cmd.Wait(t); code != 0 {
				t.Fatalf("exit %d: %s", code, cmd.Stderr.String())
			}
			if got := strings.TrimSpace(cmd.Stdout.String()); got != c.want {
				t.Fatalf("job saw %q, want %q", got, c.want)
			}
			rec := r.MustStatus(t)
			ev := r.Events(t)
			if rec.AgentSocket != "" || indexOf(ev, "agent_scoped") >= 0 || indexOf(ev, "authority_revoked") >= 0 {
				t.Fatalf("a relay was started: %q %v", rec.AgentSocket, ev)
			}
			if c.event != "" && count(ev, c.event) != 1 {
				t.Fatalf("want one %s: %v", c.event, ev)
			}
			if strings.Contains(r.File("events.jsonl"), a.Sock) {
				t.Fatal("the journal holds the inherited socket path (an environment value)")
			}
		})
	}
	if code, _, _ := runtest.Exec(t, root, "run", "--agent", "forwarded", "m-bad", "--", "true"); code != 64 {
		t.Fatalf("--agent forwarded: exit %d, want 64", code)
	}
}

func indexOf(ss []string, s string) int {
	for i, v := range ss {
		if v == s {
			return i
		}
	}
	return -1
}

func count(ss []string, s string) int {
	n := 0
	for _, v := range ss {
		if v == s {
			n++
		}
	}
	return n
}

// The worked example: examples/git-credential-agent-wrap hands a token
// to git inside a live run, refuses it to a process the cancelled run left
// behind, and to a shell of the user outside any run.
func TestExampleGitCredentialHelper(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("git not found (CI=true, so this fails instead of skipping)\nhint: apt-get install git")
		}
		t.Skip("git not found\nhint: apt-get install git")
	}
	root := runtest.NewRoot(t)
	setAuthSock(t, "")
	dir := t.TempDir()
	helper, err := filepath.Abs("../examples/git-credential-agent-wrap")
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "git.secret")
	if err := os.WriteFile(secret, []byte("robot\ntok-3141592653\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_TERMINAL_PROMPT", "0")
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	t.Setenv("HOME", dir)
	t.Setenv("AGENT_WRAP_ROOT", root)
	fill := "printf 'protocol=https\\nhost=git.example.com\\n\\n' | git -c credential.helper= -c " +
		sshtest.Quote("credential.helper="+helper+" "+secret) + " credential fill"
	// The job fetches once, then (ignoring TERM, so it outlives the intent)
	// waits for the test's word and fetches again.
	job := `trap '' TERM; ` + fill + ` >first 2>&1; echo $? >first.rc; ` +
		`while [ ! -e go ]; do sleep 0.05; done; ` + fill + ` >second 2>&1; echo $? >second.rc; sleep 300`
	_, r := run(t, root, "", "--lease", "5m", "--grace", "60s", "git", "--", "sh", "-c", "cd "+dir+" && "+job)
	runtest.Eventually(t, "the first fetch", func() bool { _, err := os.Stat(filepath.Join(dir, "first.rc")); return err == nil })
	first, _ := os.ReadFile(filepath.Join(dir, "first"))
	if !strings.Contains(string(first), "password=tok-3141592653") {
		t.Fatalf("inside the run, git got no token:\n%s", first)
	}
	runtest.Exec(t, root, "cancel", "--wait", "0.1s", "git")
	r.WaitState(t, statusfile.Cancelling)
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the second fetch", func() bool { _, err := os.Stat(filepath.Join(dir, "second.rc")); return err == nil })
	second, _ := os.ReadFile(filepath.Join(dir, "second"))
	if strings.Contains(string(second), "tok-") || !strings.Contains(string(second), "not a live run") {
		t.Fatalf("after the cancel, the left-behind process got:\n%s", second)
	}
	// A shell of the user, outside any run.
	sh := exec.CommandContext(context.Background(), "sh", "-c", fill)
	sh.Dir = dir
	out, _ := sh.CombinedOutput()
	if bytes.Contains(out, []byte("tok-")) {
		t.Fatalf("outside any run, git got the token:\n%s", out)
	}
	es := r.Journal(t)
	assertNoAcceptedAfterIntent(t, es)
	acts := actions(es)
	if len(acts) != 2 || field(acts[0], "decision") != authority.Accepted || field(acts[1], "decision") != authority.Refused ||
		field(acts[0], "channel") != "git-credential" || field(acts[0], "target") != "git.example.com" {
		t.Fatalf("actions %v", acts)
	}
	assertNothingSecret(t, r, "tok-3141592653")
}

// The socket path works for a long root and a 128-character run ID, whose
// run directory is too long for a socket address: the relay listens on a
// short path in a private per-user directory, and removes it at the end.
func TestScopedAgentLongPath(t *testing.T) {
	a := agenttest.Start(t)
	root := filepath.Join(t.TempDir(), strings.Repeat("deep", 20), "runs")
	id := strings.Repeat("x", 127) + "1"
	c, r := run(t, root, a.Sock, "--lease", "5m", id, "--", "sh", "-c", `echo "$SSH_AUTH_SOCK"; ssh-add -l`)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, c.Stdout.String(), c.Stderr.String())
	}
	rec := r.MustStatus(t)
	lines := strings.Split(strings.TrimSpace(c.Stdout.String()), "\n")
	if len(lines) != 2 || lines[0] != rec.AgentSocket || len(rec.AgentSocket) > 107 ||
		strings.HasPrefix(rec.AgentSocket, root) || !strings.Contains(lines[1], a.Fingerprint) {
		t.Fatalf("socket %q (%d bytes), output:\n%s", rec.AgentSocket, len(rec.AgentSocket), c.Stdout.String())
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Dir(rec.AgentSocket), &st); err != nil || st.Mode&0o777 != 0o700 || int(st.Uid) != os.Geteuid() {
		t.Fatalf("socket directory mode %o uid %d: %v", st.Mode&0o777, st.Uid, err)
	}
	if _, err := os.Lstat(rec.AgentSocket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// Agent requests racing a cancel: a job lists keys as fast as it can while
// it is cancelled. No request is accepted after cancel_requested, and none
// is journaled after authority_revoked: the requests in flight at the
// revocation are answered (refused) before it is journaled.
func TestAgentRequestsRacingCancel(t *testing.T) {
	a := agenttest.Start(t)
	root := runtest.NewRoot(t)
	t.Setenv("AUTHTEST_SPAM", "1")
	c, r := run(t, root, a.Sock, "--lease", "5m", "spam", "--", os.Args[0])
	runtest.Eventually(t, "50 accepted requests", func() bool {
		return strings.Count(r.File("events.jsonl"), `"decision":"accepted"`) >= 50
	})
	if code, _, stderr := runtest.Exec(t, root, "cancel", "spam"); code != 0 {
		t.Fatalf("cancel: %s", stderr)
	}
	c.Wait(t)
	es := r.Journal(t)
	assertRevokedInOrder(t, es, "cancel_requested")
	assertNoAcceptedAfterIntent(t, es)
	t.Logf("%d agent actions, %d events", len(actions(es)), len(es))
}

// run --detach scopes the agent too: the supervisor it starts gets --agent
// and the caller's SSH_AUTH_SOCK.
func TestScopedAgentDetached(t *testing.T) {
	a := agenttest.Start(t)
	root := runtest.NewRoot(t)
	setAuthSock(t, a.Sock)
	r := runtest.Run{Root: root, ID: "det"}
	t.Cleanup(r.Kill)
	if code, _, stderr := runtest.Exec(t, root, "run", "--detach", "--agent", "scoped", "det", "--", "sh", "-c", "ssh-add -l"); code != 0 {
		t.Fatalf("run --detach: %d %s", code, stderr)
	}
	if code, _, stderr := runtest.Exec(t, root, "wait", "det"); code != 0 {
		t.Fatalf("wait: exit %d %s\n%s", code, stderr, r.File("stderr.log"))
	}
	if out := r.File("stdout.log"); !strings.Contains(out, a.Fingerprint) {
		t.Fatalf("the detached job did not list the key:\n%s", out)
	}
	if rec := r.MustStatus(t); rec.AgentSocket != filepath.Join(r.Dir(), "agent.sock") {
		t.Fatalf("agent_socket %q", rec.AgentSocket)
	}
}
