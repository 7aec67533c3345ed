package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// fanoutFigure: many concurrent `agent-wrap ssh DEST -- sleep S` from this
// machine to one throwaway sshd with OpenSSH's default limits
// (MaxSessions 10, MaxStartups 10:30:100), through agent-wrap's own
// ControlMasters (--mux auto, the default):
//   - all complete and are settled, none refused;
//   - the most ssh connections sshd carries at once (its per-connection
//     processes, sampled from /proc), against runs/8 + 4;
//   - the renew sessions the host ran (a counting remote binary) for the
//     runs' renewals (a lease the sleep outlives);
//   - sshd's CPU per run-minute (its processes' utime+stime, sampled);
//   - reattach to the first new byte after the attach's session client is
//     SIGKILLed, and after its ControlMaster is SIGKILLed (replaced),
//     against a fresh `ssh DEST true` (a connection of its own).
func (r *runner) fanoutFigure() (err error) {
	tb := &benchTB{r: r}
	defer catchFatal(&err)
	srv := sshtest.Start(tb, sshtest.DefaultLimits)
	root, err := r.newRoot("fanout")
	if err != nil {
		return err
	}
	// A short directory: a socket path is at most 104 bytes on some systems.
	muxDir, err := os.MkdirTemp("", "awbench-mux-")
	if err != nil {
		return err
	}
	r.onCleanup(func() { os.RemoveAll(muxDir) })
	ledgerDir := filepath.Join(r.scratch, "fanout-ledger")
	calls := filepath.Join(r.scratch, "fanout-calls.log")
	remoteBin := filepath.Join(r.scratch, "agent-wrap-counted")
	script := "#!/bin/sh\necho \"$*\" >> " + sshtest.Quote(calls) + "\nexec " + sshtest.Quote(r.bin) + " \"$@\"\n"
	if err := os.WriteFile(remoteBin, []byte(script), 0o755); err != nil {
		return err
	}
	rsh := sshtest.Quote(append([]string{"ssh"}, srv.SSHArgs()...)...)
	env := append(os.Environ(), "AGENT_WRAP_MUX_DIR="+muxDir)
	ctl := func(id string, flags []string, argv ...string) *exec.Cmd {
		args := []string{"ssh", "--rsh", rsh, "--remote-bin", remoteBin, "--remote-root", root, "--ledger", ledgerDir, "--id", id, "--grace", "2s"}
		args = append(append(args, flags...), srv.Destination(), "--")
		cmd := exec.Command(r.bin, append(args, argv...)...)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}

	// 1. The fan-out.
	runs, sleep := 200, 20
	if r.quick {
		runs, sleep = 50, 8
	}
	os.Remove(calls)
	sampler := newSSHDSampler(srv.PID())
	t0 := time.Now()
	cmds := make([]*exec.Cmd, runs)
	outs := make([]*bytes.Buffer, runs)
	ids := make([]string, runs)
	for i := range cmds {
		ids[i] = r.id("fan")
		outs[i] = &bytes.Buffer{}
		cmds[i] = ctl(ids[i], []string{"--lease", "30s", "--renew-every", "5s"}, "sleep", strconv.Itoa(sleep))
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		if err := cmds[i].Start(); err != nil {
			return err
		}
		c := cmds[i]
		r.killGroupAtCleanup(c)
	}
	failed := 0
	var firstErr string
	for i, c := range cmds {
		err := c.Wait()
		if err != nil || !settledCompleted(ledgerDir, ids[i]) {
			failed++
			if firstErr == "" {
				firstErr = fmt.Sprintf("%s: %v: %s", ids[i], err, oneLine(fmt.Errorf("%s", outs[i].String())))
			}
		}
	}
	wall := time.Since(t0)
	peak, cpu := sampler.stop()
	refused := strings.Count(srv.Log(), "MaxStartups") + strings.Count(srv.Log(), "drop connection")
	sessions, renewed := countRenewSessions(calls)
	limit := runs/8 + 4
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("fan-out: %d concurrent runs, ssh connections at once", runs),
		measured: strconv.Itoa(peak), baseline: fmt.Sprintf("%d (runs/8 + 4)", limit),
		ratio: fmt.Sprintf("%.2f×", float64(peak)/float64(limit)), target: "≤ 1×, all settled, none refused", limit: fmt.Sprintf("%.2f", float64(peak)/float64(limit)),
		pass: passIf(peak <= limit && failed == 0 && refused == 0),
	})
	runMinutes := float64(runs) * float64(sleep) / 60
	r.detail("fan-out: %d × `agent-wrap ssh --lease 30s --renew-every 5s DEST -- sleep %d` at once, sshd MaxSessions 10, MaxStartups 10:30:100: %d not completed and settled%s; sshd refused %d; %v wall; at most %d ssh connections at once (sshd's per-connection processes); %d renew sessions renewed %d runs' leases; sshd CPU %.2f s in all, %.1f ms per run-minute",
		runs, sleep, failed, errNote(firstErr), refused, wall.Round(10*time.Millisecond), peak, sessions, renewed, cpu, 1000*cpu/runMinutes)

	// 2. Reattach, against a fresh connection.
	fresh := func() (float64, error) {
		return timeCmd(exec.Command("ssh", append(srv.SSHArgs(), "--", srv.Destination(), "true")...))
	}
	reattach := func(killMaster bool) func() (float64, error) {
		return func() (float64, error) {
			id := r.id("fan-re")
			cmd := ctl(id, []string{"--lease", "60s"}, "sh", "-c", "while :; do echo x; sleep 0.005; done")
			victim := func() int { return attachClient(cmd.Process.Pid) }
			if killMaster {
				victim = func() int { return recordedMaster(muxDir) }
			}
			return r.reattachDelay(cmd, "attach session", victim)
		}
	}
	s, err := bench.Interleave(1, r.n(10, 4), reattach(false), reattach(true), fresh)
	if err != nil {
		return err
	}
	a, m, b := bench.Median(s[0]), bench.Median(s[1]), bench.Median(s[2])
	r.msRow("reattach (mux) to first new byte", a, b, "fresh ssh DEST true", 2)
	r.msRow("reattach, ControlMaster killed (replaced)", m, b, "fresh ssh DEST true", 2)
	r.detail("reattach through the mux, the attach's session client SIGKILLed, to the first new byte: %s; its ControlMaster SIGKILLed (a new master started): %s; a fresh `ssh DEST true` (own connection): %s",
		spread(s[0], bench.Ms), spread(s[1], bench.Ms), spread(s[2], bench.Ms))
	return nil
}

func errNote(s string) string {
	if s == "" {
		return ""
	}
	return " (first: " + s + ")"
}

// settledCompleted reports whether the ledger has run id settled
// completed with exit 0.
func settledCompleted(ledgerDir, id string) bool {
	b, err := os.ReadFile(filepath.Join(ledgerDir, id+".json"))
	if err != nil {
		return false
	}
	var rec struct {
		State    string `json:"state"`
		Outcome  string `json:"outcome"`
		ExitCode *int   `json:"exit_code"`
	}
	return json.Unmarshal(b, &rec) == nil && rec.State == "settled" && rec.Outcome == "completed" && rec.ExitCode != nil && *rec.ExitCode == 0
}

// countRenewSessions reads the counting remote binary's log: how many
// renew sessions ran, and how many runs they renewed in all.
func countRenewSessions(path string) (sessions, renewed int) {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		for i, w := range f {
			if w == "renew" {
				sessions++
				for _, x := range f[i+1:] {
					if !strings.HasPrefix(x, "--") {
						renewed++
					}
				}
				break
			}
		}
	}
	return sessions, renewed
}

// recordedMaster returns the PID of a live ControlMaster recorded in dir,
// or 0.
func recordedMaster(dir string) int {
	if ms := controller.RecordedMasters(dir); len(ms) > 0 {
		return ms[0].PID
	}
	return 0
}

// sshdSampler samples, every 20 ms, the sshd processes below the listener:
// how many per-connection processes (the listener's children) there are,
// and the CPU (utime+stime) of every sshd process below it, as last seen.
type sshdSampler struct {
	listener int
	mu       sync.Mutex
	peak     int
	cpu      map[[2]uint64]uint64 // (pid, start) -> ticks
	done     chan struct{}
	quit     chan struct{}
}

func newSSHDSampler(listener int) *sshdSampler {
	s := &sshdSampler{listener: listener, cpu: map[[2]uint64]uint64{}, done: make(chan struct{}), quit: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			s.sample()
			select {
			case <-s.quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return s
}

func (s *sshdSampler) sample() {
	all, _ := proc.Scan()
	parent := map[int]int{}
	for _, p := range all {
		parent[p.PID] = p.PPID
	}
	below := func(pid int) bool {
		for i := 0; i < 16 && pid > 1; i++ {
			if pid = parent[pid]; pid == s.listener {
				return true
			}
		}
		return false
	}
	conns := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range all {
		if p.Dead() || !strings.HasPrefix(p.Comm, "sshd") || (p.PID != s.listener && !below(p.PID)) {
			continue
		}
		if p.PPID == s.listener {
			conns++
		}
		if t, ok := cpuTicks(p.PID); ok {
			s.cpu[[2]uint64{uint64(p.PID), p.Start}] = t
		}
	}
	s.peak = max(s.peak, conns)
}

// stop ends the sampling: the most connections seen at once, and the CPU
// seconds of sshd's processes.
func (s *sshdSampler) stop() (peak int, cpu float64) {
	close(s.quit)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	var ticks uint64
	for _, t := range s.cpu {
		ticks += t
	}
	return s.peak, float64(ticks) / 100 // USER_HZ
}

// cpuTicks returns utime+stime of pid from /proc/PID/stat.
func cpuTicks(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, false
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	return ut + st, err1 == nil && err2 == nil
}
