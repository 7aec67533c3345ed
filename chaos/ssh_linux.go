package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/internal/relay"
	"github.com/agent-wrap/agent-wrap/internal/sshtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The controller side: runs drawn with SSH go through `agent-wrap ssh`, to
// a real sshd on 127.0.0.1 (internal/sshtest) reached through the relay
// (internal/relay), which the nemesis cuts and blackholes. The program
// that plays them must call relay.Connector first thing in main (or
// TestMain): ssh starts it again as its ProxyCommand.

// harnessT is the small part of a test that sshtest needs, for a program:
// cleanups run at close, a fatal error ends Start by a panic recovered in
// startSSH.
type harnessT struct {
	dir      string
	cleanups []func()
	err      error
}

func (h *harnessT) Helper()          {}
func (h *harnessT) Cleanup(f func()) { h.cleanups = append(h.cleanups, f) }
func (h *harnessT) Errorf(format string, a ...any) {
	if h.err == nil {
		h.err = fmt.Errorf(format, a...)
	}
}
func (h *harnessT) Fatalf(format string, a ...any) { h.Errorf(format, a...); panic(h) }
func (h *harnessT) Skipf(format string, a ...any)  { h.Errorf(format, a...); panic(h) }
func (h *harnessT) TempDir() string {
	d, err := os.MkdirTemp(h.dir, "sshd-")
	if err != nil {
		h.Fatalf("%v", err)
	}
	return d
}

func (h *harnessT) close() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
	h.cleanups = nil
}

// sshSide is the sshd, the relay in front of it, the controller's ledger
// and the directory of its ControlMasters.
type sshSide struct {
	h      *harnessT
	srv    *sshtest.Server
	relay  *relay.Relay
	ledger string
	// mux is $AGENT_WRAP_MUX_DIR of every root command of the schedule:
	// the controllers' masters (--mux auto, the default) are recorded
	// there, where the nemesis and the teardown find them by PID and
	// start time, apart from any other controller's on the machine.
	mux string
}

// startSSH starts sshd and the relay for a schedule with SSH runs.
func (p *player) startSSH() (side *sshSide, err error) {
	h := &harnessT{dir: p.base}
	defer func() {
		if v := recover(); v != nil {
			if v != h {
				panic(v)
			}
			h.close()
			side, err = nil, fmt.Errorf("sshd for the controller runs: %w", h.err)
		}
	}()
	srv := sshtest.Start(h)
	rl, err := relay.Listen(fmt.Sprintf("%s:%d", srv.Host(), srv.Port()))
	if err != nil {
		h.close()
		return nil, err
	}
	h.Cleanup(rl.Close)
	ledger := filepath.Join(p.base, "ledger")
	if err := os.Mkdir(ledger, 0o700); err != nil {
		h.close()
		return nil, err
	}
	if err := os.Mkdir(ledger+"-nested", 0o700); err != nil {
		h.close()
		return nil, err
	}
	mux := filepath.Join(p.base, "mux")
	if err := os.Mkdir(mux, 0o700); err != nil {
		h.close()
		return nil, err
	}
	return &sshSide{h: h, srv: srv, relay: rl, ledger: ledger, mux: mux}, nil
}

// masters are the ControlMasters recorded in the schedule's mux
// directory and still alive (start time checked).
func (s *sshSide) masters() []proc.Identity {
	var out []proc.Identity
	for _, m := range controller.RecordedMasters(s.mux) {
		out = append(out, proc.Identity{PID: m.PID, Start: m.Start})
	}
	return out
}

// sshdProcs are the per-connection sshd processes (the listening sshd's
// children), and with listener the listening sshd first.
func (s *sshSide) sshdProcs(listener bool) []proc.Identity {
	var out []proc.Identity
	if listener {
		out = append(out, proc.Identity{PID: s.srv.PID(), Start: s.srv.StartTime()})
	}
	return append(out, childrenOf(s.srv.PID(), nil)...)
}

// clientsOf are the `ssh` clients of the controller id: its children,
// less the masters (a master forks into the background, and may land
// under a controller that is a subreaper).
func (s *sshSide) clientsOf(id proc.Identity) []proc.Identity {
	if id.PID <= 1 {
		return nil
	}
	skip := map[int]bool{}
	for _, m := range s.masters() {
		skip[m.PID] = true
	}
	return childrenOf(id.PID, skip)
}

// waitClients waits up to d for an `ssh` client of the controller id
// (clientsOf), looking every 2 ms at the PIDs handed out since the last
// look (ns_last_pid): a controller's clients through a ControlMaster live
// for milliseconds, which a scan of /proc every 100 ms rarely meets.
func (s *sshSide) waitClients(id proc.Identity, d time.Duration, quit <-chan struct{}) []proc.Identity {
	if ids := s.clientsOf(id); len(ids) > 0 || id.PID <= 1 {
		return ids
	}
	skip := map[int]bool{}
	for _, m := range s.masters() {
		skip[m.PID] = true
	}
	last, err := proc.LastPID()
	if err != nil {
		return nil
	}
	for until := time.Now().Add(d); time.Now().Before(until); {
		select {
		case <-quit:
			return nil
		case <-time.After(2 * time.Millisecond):
		}
		now, err := proc.LastPID()
		if err != nil {
			return nil
		}
		if now < last { // the PIDs wrapped around: look at them all
			if ids := s.clientsOf(id); len(ids) > 0 {
				return ids
			}
			last = now
			continue
		}
		var out []proc.Identity
		for pid := last + 1; pid <= now; pid++ {
			if st, err := proc.ReadStat(pid); err == nil && st.PPID == id.PID && !st.Dead() && !skip[pid] {
				out = append(out, proc.Identity{PID: st.PID, Start: st.Start})
			}
		}
		if len(out) > 0 {
			return out
		}
		last = now
		if !proc.Alive(id.PID, id.Start) {
			return nil
		}
	}
	return nil
}

// childrenOf lists the live children of ppid, but those in skip.
func childrenOf(ppid int, skip map[int]bool) []proc.Identity {
	all, _ := proc.Scan()
	var out []proc.Identity
	for _, st := range all {
		if st.PPID == ppid && !st.Dead() && !skip[st.PID] {
			out = append(out, proc.Identity{PID: st.PID, Start: st.Start})
		}
	}
	return out
}

// rsh is the --rsh of the controller runs: ssh to the test sshd through
// the relay.
func (s *sshSide) rsh() string {
	words := append([]string{"ssh"}, s.srv.SSHArgs()...)
	words = append(words, "-o", "ProxyCommand="+s.relay.ProxyCommand(), "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=3")
	return sshtest.Quote(words...)
}

// sshArgs is the controller's command line for run r. Its stdin is
// /dev/null (exec's default), as with ssh -n.
func (p *player) sshArgs(r *runState) []string {
	rs := r.spec
	args := []string{"ssh", "--rsh", p.ssh.rsh(), "--remote-bin", p.bin, "--remote-root", r.u.root,
		"--id", r.id, "--lease", fmt.Sprint(rs.Lease), "--grace", fmt.Sprint(rs.Grace),
		"--give-up", fmt.Sprint(rs.Lease + rs.Grace + 5e9), "--ledger", p.ledgerArg(r)}
	if rs.LateRenew {
		args = append(args, "--renew-every", fmt.Sprint(3*rs.Lease))
	}
	args = append(args, p.ssh.srv.Destination(), "--", "env", r.tag)
	if rs.Shape == Nested {
		return append(args, p.nestedJob(r)...)
	}
	return append(args, shapeScript(rs.Shape, rs.Index)...)
}

// nestedJob is the job of a nested controller run: `agent-wrap ssh` from
// the host back to the same sshd and root, with a run of its own (ID
// r.id-n) whose job sleeps with r's tag, so that every process of both
// runs is r's. It has a ledger of its own (not judged by ledger-truth)
// and no masters (--mux off): a master it started would carry the tag
// and outlive a killed controller by ControlPersist's 60 s. Its lease
// and grace are short, so that once the outer run's stop has killed it,
// the inner run ends by its own lease well inside the outer's bound.
func (p *player) nestedJob(r *runState) []string {
	return []string{p.bin, "ssh", "--mux", "off", "--rsh", p.ssh.rsh(), "--remote-bin", p.bin, "--remote-root", r.u.root,
		"--id", r.id + "-n", "--lease", "2s", "--grace", "1s", "--give-up", "8s", "--ledger", p.ssh.ledger + "-nested",
		p.ssh.srv.Destination(), "--", "env", r.tag, "sleep", "60"}
}

// ledgerOf reads the controller's record of r (nil if none): the file,
// or the row through `agent-wrap ledger --json`.
func (p *player) ledgerOf(r *runState) (map[string]any, error) {
	if r.spec.PG && p.pg != nil {
		return p.pgLedgerOf(r)
	}
	b, err := os.ReadFile(filepath.Join(p.ssh.ledger, r.id+".json"))
	if err != nil {
		return nil, nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return map[string]any{"unparseable": string(b)}, nil
	}
	return m, nil
}

// checkLedger: a controller run ends settled (after a settle if the
// controller could not), with the host's verdict: completed or cancelled
// as reconcile says, with its exit code; unknown only where the host says
// so or cannot be asked.
func (p *player) checkLedger(idx int, r *runState, hostOutcome string) {
	// The controller settles its own run: wait for it (its --give-up
	// bounds it) before judging the ledger.
	select {
	case <-r.done:
	case <-time.After(r.spec.Lease + r.spec.Grace + 30*time.Second):
		p.violate(CheckLedger, idx, "the controller still runs %v after the end of the schedule, past its --give-up", r.spec.Lease+r.spec.Grace+30*time.Second)
		return
	}
	if r.spec.Shape == Nested {
		// Not judged (its controller is the outer job, killed with it):
		// shown, so that a reader sees the nested run happened.
		b, _ := os.ReadFile(filepath.Join(p.ssh.ledger+"-nested", r.id+"-n.json"))
		p.logf("run %d: the nested controller's ledger record: %s", idx, firstLine(string(b)))
	}
	if r.spec.PG && p.pg != nil && !p.pg.up(30*time.Second) {
		p.logf("run %d: PostgreSQL is still not restarted after a kill-postmaster", idx)
	}
	m, err := p.ledgerOf(r)
	if err != nil {
		p.violate(CheckLedger, idx, "the ledger cannot be read: %v", err)
		return
	}
	p.mu.Lock()
	usage := !r.ended.IsZero() && r.code == 64
	p.mu.Unlock()
	if m == nil && !usage && hostOutcome != "none" {
		// The launching record is written before the first connection: a
		// controller killed before it launched nothing.
		p.violate(CheckLedger, idx, "no ledger record for controller run %s, but the host has the run (reconcile: %s)", r.id, hostOutcome)
	}
	if m == nil {
		return
	}
	if m["state"] != "settled" {
		code, out := p.exec(p.users[0], 60e9, "settle", "--ledger", p.ledgerArg(r), r.id)
		p.logf("run %d: settle exited %d %s", idx, code, firstLine(out))
		if m, err = p.ledgerOf(r); err != nil || m == nil {
			p.violate(CheckLedger, idx, "the ledger record after a settle: %v (error %v)", m, err)
			return
		}
	}
	if m["state"] == "settled" {
		// Settled once: another settle writes nothing over it. (One
		// settled unknown is settled again by design, the host may know
		// more by now: it must stay settled, its outcome may be learned.)
		code, out := p.exec(p.users[0], 60e9, "settle", "--ledger", p.ledgerArg(r), r.id)
		again, err := p.ledgerOf(r)
		if err != nil || again == nil || again["state"] != "settled" || (m["outcome"] != "unknown" && !sameSettlement(m, again)) {
			p.violate(CheckLedger, idx, "a settle of the settled run (exit %d %s) changed its record:\nbefore %v\nafter  %v (error %v)", code, firstLine(out), m, again, err)
		} else if again != nil {
			m = again
		}
	}
	outcome, _ := m["outcome"].(string)
	p.mu.Lock()
	// Both the record and the journal torn by the harness: what the host
	// says now is rebuilt from what was left (or written anew by a wrapper
	// that woke after the tear), not what the controller learned before.
	rebuilt := r.torn["status.json"] && r.torn["events.jsonl"]
	p.mu.Unlock()
	switch {
	case m["state"] != "settled":
		p.violate(CheckLedger, idx, "the ledger record is %v after the controller and a settle:\n%v", m["state"], m)
	case (outcome == "completed" || outcome == "cancelled") && (hostOutcome == "completed" || hostOutcome == "cancelled") && hostOutcome != outcome && !rebuilt:
		// (A host that says unknown now, its record torn since, does not
		// contradict what the controller learned before.)
		p.violate(CheckLedger, idx, "the ledger says %s, the host's reconcile %s:\n%v", outcome, hostOutcome, m)
	case outcome == "not_started" && hostOutcome != "" && hostOutcome != "none":
		p.violate(CheckLedger, idx, "the ledger says not_started, the host's reconcile %s", hostOutcome)
	}
	p.logf("run %d: ledger (%s) %v/%v exit %v settled_by %v", idx, map[bool]string{true: "PostgreSQL", false: "files"}[r.spec.PG], m["state"], outcome, m["exit_code"], m["settled_by"] != nil)
	if ec, ok := m["exit_code"].(float64); ok && (outcome == "completed" || outcome == "cancelled") {
		p.mu.Lock()
		code, ended := r.code, !r.ended.IsZero()
		p.mu.Unlock()
		if ended && code >= 0 && code != 255 && code != int(ec) { // -1: the nemesis killed it
			p.violate(CheckLedger, idx, "the controller exited %d, its ledger says exit %d (%s)", code, int(ec), outcome)
		}
	}
}

// sameSettlement: two reads of a settled record say the same settlement.
func sameSettlement(a, b map[string]any) bool {
	for _, k := range []string{"state", "outcome", "exit_code", "cause", "settled_at", "settled_by"} {
		if fmt.Sprint(a[k]) != fmt.Sprint(b[k]) {
			return false
		}
	}
	return true
}
