package main

// The authority figure: what scoping a run's authority costs.
//   - sign latency through the run's relay against the same ssh-agent
//     directly, from one process inside the run, alternating the two on
//     one open connection each (target: relay ≤ 1.5× direct + 1 ms);
//   - `agent-wrap authorize --pid` from outside against `agent-wrap
//     version`, the start of the binary, in the same rounds;
//   - revocation: from the intent (cancel_requested in the journal) to the
//     socket gone (authority_revoked, journaled after the removal), and
//     from the TERM to the wrapper to the socket gone, over cancels of runs
//     that hold a scoped agent.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// sshAgent starts ssh-agent in the foreground with one new ed25519 key.
func (r *runner) sshAgent() (sock string, err error) {
	dir, err := os.MkdirTemp(r.scratch, "agent-")
	if err != nil {
		return "", err
	}
	sock = filepath.Join(dir, "agent.sock")
	if _, err := r.start(nil, nil, false, "ssh-agent", "-D", "-a", sock); err != nil {
		return "", fmt.Errorf("ssh-agent: %w", err)
	}
	if err := bench.WaitUntil(time.Minute, 5*time.Millisecond, func() (bool, error) {
		_, err := os.Stat(sock)
		return err == nil, err
	}); err != nil {
		return "", err
	}
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ssh-keygen: %v: %s", err, out)
	}
	add := exec.Command("ssh-add", key)
	add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	if out, err := add.CombinedOutput(); err != nil {
		return "", fmt.Errorf("ssh-add: %v: %s", err, out)
	}
	return sock, nil
}

func (r *runner) authority() error {
	up, err := r.sshAgent()
	if err != nil {
		return err
	}
	root, err := r.newRoot("authority")
	if err != nil {
		return err
	}
	if err := r.signLatency(root, up); err != nil {
		return err
	}
	if err := r.authorizeTime(root); err != nil {
		return err
	}
	return r.revocation(root, up)
}

// signSamples is what `awbench signloop` prints: seconds per signature.
type signSamples struct {
	Direct, Relay []float64
}

func (r *runner) signLatency(root, up string) error {
	n := r.n(400, 100)
	id := r.id("sign")
	out, err := os.CreateTemp(r.scratch, "sign-")
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(r.bin, "--root", root, "run", "--no-stream", "--lease", "5m", id, "--", r.self, "signloop", strconv.Itoa(n))
	cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+up, "AWBENCH_UPSTREAM="+up)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("signloop run: %v: %s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(root, id, "stdout.log"))
	if err != nil {
		return err
	}
	var s signSamples
	if err := json.Unmarshal(b, &s); err != nil {
		stderr, _ := os.ReadFile(filepath.Join(root, id, "stderr.log"))
		return fmt.Errorf("signloop: %v: %s %s", err, b, stderr)
	}
	d, rl := bench.Median(s.Direct), bench.Median(s.Relay)
	limit := 1.5*d + 0.001
	r.rows = append(r.rows, row{
		figure:   "ssh-agent sign through the run's relay",
		measured: bench.Ms(rl), baseline: bench.Ms(d) + " (ssh-agent directly)",
		ratio:  fmt.Sprintf("%.1f×", rl/d),
		target: "≤ 1.5× direct + 1 ms",
		limit:  fmt.Sprintf("%.2f", rl/limit),
		pass:   passIf(rl <= limit),
	})
	r.detail("sign, ed25519, one open connection each, alternating, from a process of the run: relay %s; direct %s (each relayed sign is checked under the run's lock and journaled, synced, before it goes on)",
		spread(s.Relay, bench.Ms), spread(s.Direct, bench.Ms))
	return nil
}

// signloop runs inside a run: n signatures through $SSH_AUTH_SOCK (the
// relay) and n directly through $AWBENCH_UPSTREAM, alternating; it prints
// the samples as JSON.
func signloop(args []string, stdout, stderr io.Writer) int {
	n, err := strconv.Atoi(args[0])
	if len(args) != 1 || err != nil {
		fmt.Fprintln(stderr, "usage: awbench signloop N")
		return 64
	}
	dial := func(env string) (agent.ExtendedAgent, error) {
		c, err := net.Dial("unix", os.Getenv(env))
		if err != nil {
			return nil, err
		}
		return agent.NewClient(c), nil
	}
	relay, err := dial("SSH_AUTH_SOCK")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	direct, err := dial("AWBENCH_UPSTREAM")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	keys, err := relay.List()
	if err != nil || len(keys) == 0 {
		fmt.Fprintf(stderr, "list through the relay: %v (%d keys)\n", err, len(keys))
		return 1
	}
	data := make([]byte, 64)
	sign := func(a agent.ExtendedAgent) (float64, error) {
		t0 := time.Now()
		_, err := a.Sign(keys[0], data)
		return time.Since(t0).Seconds(), err
	}
	s, err := bench.Interleave(5, n,
		func() (float64, error) { return sign(direct) },
		func() (float64, error) { return sign(relay) })
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	_ = json.NewEncoder(stdout).Encode(signSamples{Direct: s[0], Relay: s[1]})
	return 0
}

func (r *runner) authorizeTime(root string) error {
	id := r.id("authorize")
	w, err := r.start(nil, nil, false, r.bin, "--root", root, "run", "--no-stream", "--lease", "5m", id, "--", "sleep", "300")
	if err != nil {
		return err
	}
	r.onCleanup(func() { r.stopRun(root, id, w) })
	rec, err := waitRunning(root, id, w.pid, nil)
	if err != nil {
		return err
	}
	pid := strconv.Itoa(rec.PID)
	s, err := bench.Interleave(2, r.n(40, 10),
		func() (float64, error) { return r.timed(0, nil, r.bin, "--root", root, "authorize", "--pid", pid) },
		func() (float64, error) { return r.timed(0, nil, r.bin, "version") })
	if err != nil {
		return err
	}
	a, v := bench.Median(s[0]), bench.Median(s[1])
	r.rows = append(r.rows, row{
		figure:   "`agent-wrap authorize`, accepted",
		measured: bench.Ms(a), baseline: bench.Ms(v) + " (`agent-wrap version`)",
		ratio:  fmt.Sprintf("%.1f×", a/v),
		target: "≤ version + 5 ms",
		limit:  fmt.Sprintf("%.2f", a/(v+0.005)),
		pass:   passIf(a <= v+0.005),
	})
	r.detail("authorize --pid of a job, from outside, accepted (found by its cgroup, decided under the run's lock, journaled and synced): %s; version: %s",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms))
	return nil
}

func (r *runner) revocation(root, up string) error {
	var fromIntent, fromTERM []float64
	for i := 0; i < r.n(20, 7); i++ {
		id := r.id("revoke")
		w, err := r.startWithAgent(up, r.bin, "--root", root, "run", "--no-stream", "--lease", "5m", id, "--", "sleep", "300")
		if err != nil {
			return err
		}
		r.onCleanup(func() { r.stopRun(root, id, w) })
		rec, err := waitRunning(root, id, w.pid, nil)
		if err != nil {
			return err
		}
		if rec.AgentSocket == "" {
			return errors.New("the run has no agent socket")
		}
		t0 := time.Now()
		if err := w.pfd.Signal(unix.SIGTERM); err != nil {
			return err
		}
		if _, err := w.exited(30 * time.Second); err != nil {
			return err
		}
		if err := w.wait(); err != nil {
			return err
		}
		if _, err := os.Lstat(rec.AgentSocket); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("run %s: socket still there after the run: %v", id, err)
		}
		f, err := os.Open(filepath.Join(root, id, "events.jsonl"))
		if err != nil {
			return err
		}
		es, err := journal.ReadAll(f)
		f.Close()
		if err != nil {
			return err
		}
		first := map[string]journal.Entry{}
		for _, e := range es {
			if _, ok := first[e.Event]; !ok {
				first[e.Event] = e
			}
		}
		intent, okI := first["cancel_requested"]
		revoked, okR := first["authority_revoked"]
		signal, okS := first["signal_sent"]
		if !okI || !okR || !okS || revoked.Seq < intent.Seq || signal.Seq < revoked.Seq {
			return fmt.Errorf("run %s: want cancel_requested < authority_revoked < signal_sent in the journal", id)
		}
		fromIntent = append(fromIntent, revoked.At.Sub(intent.At).Seconds())
		fromTERM = append(fromTERM, revoked.At.Sub(t0).Seconds())
		if st, err := readRecord(root, id); err != nil || st.State != statusfile.Cancelled {
			return fmt.Errorf("run %s: not cancelled: %v", id, err)
		}
	}
	m := bench.Median(fromIntent)
	r.rows = append(r.rows, row{
		figure:   "revocation, intent to socket gone",
		measured: bench.Ms(m), baseline: "-", ratio: "-",
		target: "≤ 5 ms, before the first signal",
		limit:  fmt.Sprintf("%.2f", m/0.005),
		pass:   passIf(m <= 0.005),
	})
	r.detail("revocation of a scoped agent at a cancel by TERM: intent (cancel_requested) to authority_revoked %s; TERM to authority_revoked %s; authority_revoked precedes signal_sent in every run",
		spread(fromIntent, bench.Ms), spread(fromTERM, bench.Ms))
	return nil
}

// startWithAgent is start with SSH_AUTH_SOCK=up in the environment.
func (r *runner) startWithAgent(up string, argv ...string) (*started, error) {
	old, had := os.LookupEnv("SSH_AUTH_SOCK")
	os.Setenv("SSH_AUTH_SOCK", up)
	defer func() {
		if had {
			os.Setenv("SSH_AUTH_SOCK", old)
		} else {
			os.Unsetenv("SSH_AUTH_SOCK")
		}
	}()
	return r.start(nil, nil, false, argv...)
}
