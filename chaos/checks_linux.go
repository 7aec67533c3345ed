package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// The checkers, by name. Each is checked continuously (every few hundred
// milliseconds while the schedule plays) or at the end, as noted.
const (
	// lease-bound (continuous): no process of a run is alive past its
	// deadline + grace + the watchdog's interval + 3 s (+ Config.Slack, +
	// the time the harness kept the watchdog stopped or dead).
	CheckLeaseBound = "lease-bound"
	// terminal-truth (continuous): a terminal record that lists no
	// survivors ("nothing survived") is true: no process of the run is
	// alive two seconds after it was first seen.
	CheckTerminalTruth = "terminal-truth"
	// states-forward (continuous): a record the harness did not tear
	// parses, and its state never moves back (starting, running,
	// cancelling, terminal; nothing leaves a terminal state).
	CheckStatesForward = "states-forward"
	// no-revival (continuous): a deadline_epoch the harness did not tear
	// never moves later once the harness has seen it pass.
	CheckNoRevival = "no-revival"
	// claim (continuous and end): a `run` that exits 125 started nothing
	// and left no directory; one that exits otherwise left a readable
	// record (unless the harness tore it).
	CheckClaim = "claim"
	// journal (end): the journal the harness did not tear verifies, and
	// its first signal_sent follows an intent (deadline_expired,
	// cancel_requested) or the leader's exit.
	CheckJournal = "journal"
	// reconcile-truth (end): reconcile never calls a run `running` when no
	// process of it and no wrapper is alive, and never `completed` or
	// `cancelled` while a process of it is alive.
	CheckReconcile = "reconcile-truth"
	// end-nothing-alive (end): once every bound has passed, no process of
	// any run is alive.
	CheckEndNothingAlive = "end-nothing-alive"
	// ledger-truth (end): a controller run's controller exits by its
	// --give-up; its ledger record is then settled (by the controller,
	// else by a settle), with the host's outcome and exit code; the
	// controller exits with that code, or 255.
	CheckLedger = "ledger-truth"
	// gc-safe (whenever gc runs): gc removes no run whose wrapper or a
	// process of it is alive.
	CheckGC = "gc-safe"
)

// Checkers lists every checker's name.
var Checkers = []string{CheckLeaseBound, CheckTerminalTruth, CheckStatesForward, CheckNoRevival, CheckClaim, CheckJournal, CheckReconcile, CheckEndNothingAlive, CheckLedger, CheckGC}

var stateRank = map[string]int{
	statusfile.Starting: 0, statusfile.Running: 1, statusfile.Cancelling: 2,
	statusfile.Finished: 3, statusfile.Cancelled: 3, statusfile.LaunchFailed: 3,
}

func (p *player) checkLoop() {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		p.checkOnce()
		select {
		case <-p.quit:
			return
		case <-tick.C:
		}
	}
}

// boundOf is the lease bound of r now, and how it was computed.
func (p *player) boundOf(r *runState) (time.Time, string) {
	dl := r.deadline
	src := "deadline_epoch"
	if dl.IsZero() {
		from, what := r.launch, "launch"
		if r.spec.SSH && !r.recorded.IsZero() {
			from, what = r.recorded, "host record first seen"
		}
		dl = from.Add(r.spec.Lease).Add(time.Second)
		src = what + " + lease (no deadline_epoch read)"
	}
	var down time.Duration
	if w := p.wds[r.u]; w != nil {
		down = w.downSince(dl)
	}
	b := dl.Add(r.spec.Grace + p.cfg.Interval + 3*time.Second + p.cfg.Slack + down)
	return b, fmt.Sprintf("deadline %s (%s) + grace %v + interval %v + 3s + slack %v + watchdog down %v = %s",
		p.at(dl), src, r.spec.Grace, p.cfg.Interval, p.cfg.Slack, down.Round(time.Millisecond), p.at(b))
}

func (p *player) at(t time.Time) string { return fmt.Sprintf("+%.3fs", t.Sub(p.t0).Seconds()) }

func (p *player) checkOnce() {
	live := p.scan()
	now := time.Now()
	for idx, r := range p.runs {
		p.mu.Lock()
		launched := !r.launch.IsZero()
		p.mu.Unlock()
		if !launched {
			continue
		}
		dir := filepath.Join(r.u.root, r.id)
		b, err := os.ReadFile(filepath.Join(dir, "status.json"))
		var rec *statusfile.Record
		if err == nil {
			p.mu.Lock()
			if r.recorded.IsZero() {
				r.recorded = now
			}
			p.mu.Unlock()
			rec, err = statusfile.Parse(b)
			p.mu.Lock()
			torn := r.torn["status.json"]
			p.mu.Unlock()
			if err != nil && !torn {
				p.violate(CheckStatesForward, idx, "status.json does not parse: %v\n%s", err, b)
			}
		}
		p.mu.Lock()
		if rec != nil {
			r.claimed = true
			if r.wrapper.PID == 0 && rec.WrapperPID > 1 {
				r.wrapper = proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}
			}
			// With both status.json and the journal torn, the record is
			// rebuilt from what is left: a final line cut off takes the
			// way the run ended with it, and a stop may end it anew.
			rebuilt := r.torn["status.json"] && r.torn["events.jsonl"]
			if old, ok := stateRank[r.state]; ok && r.state != "" && !rebuilt {
				nw, known := stateRank[rec.State]
				if !known || nw < old || (old == 3 && rec.State != r.state) {
					st := r.state
					p.mu.Unlock()
					p.violate(CheckStatesForward, idx, "state moved from %s to %s", st, rec.State)
					p.mu.Lock()
				}
			}
			if rk, ok := stateRank[rec.State]; ok && (r.state == "" || rk >= stateRank[r.state]) {
				r.state = rec.State
			}
		}
		p.mu.Unlock()

		// The deadline.
		if db, err := os.ReadFile(filepath.Join(dir, "deadline_epoch")); err == nil {
			if v, err := strconv.ParseInt(strings.TrimSpace(string(db)), 10, 64); err == nil && v > 1e9 {
				p.mu.Lock()
				torn := r.torn["deadline_epoch"]
				prev, expired := r.lastDL, r.expiredAt
				if v > prev && prev != 0 && !expired.IsZero() && now.Sub(expired) > time.Second && !torn {
					p.mu.Unlock()
					p.violate(CheckNoRevival, idx, "deadline_epoch moved from %d to %d after the harness saw %d pass at %s", prev, v, prev, p.at(expired))
					p.mu.Lock()
				}
				if v > prev && (expired.IsZero() || torn) {
					r.lastDL = v
					r.deadline = time.Unix(v, 0)
				}
				if r.lastDL != 0 && r.expiredAt.IsZero() && now.Unix() > r.lastDL {
					r.expiredAt = now
				}
				p.mu.Unlock()
			}
		}

		ps := live[idx]
		p.mu.Lock()
		code, ended := r.code, !r.ended.IsZero()
		bound, how := p.boundOf(r)
		state := r.state
		p.mu.Unlock()
		if len(ps) > 0 && now.After(bound) && p.unseenEscapes(idx, r, ps) {
			// outside the contract: noted in the timeline
		} else if len(ps) > 0 && now.After(bound) {
			p.violate(CheckLeaseBound, idx, "alive at %s past the bound %s\nbound: %s\nrecord state %q (harness saw), `run` exited %v (%d)\n%s",
				p.at(now), p.at(bound), how, state, ended, code, describe(ps))
		}
		if ended && code == 125 && len(ps) > 0 && r.spec.Shape != Nested {
			p.violate(CheckClaim, idx, "`run` exited 125 (nothing started) but the job runs:\n%s", describe(ps))
		}
		if rec != nil && statusfile.Terminal(rec.State) {
			p.mu.Lock()
			judge := !r.judged
			r.judged = true
			p.mu.Unlock()
			if judge && len(rec.Survivors) == 0 && !sessionOnly(b) && len(ps) > 0 {
				go p.judgeTerminal(idx, r, rec, ps)
			}
		}
	}
}

// unseenEscapes reports whether every one of ps is an escape the contract
// does not cover: the run's terminal record says its stop could see the
// session only (no cgroup, stopped from outside its wrapper, which the
// nemesis killed or stopped), and each process left the recorded session
// and is not among the escapes the record lists, and holds neither of the
// run's logs as its fd 1 or 2. Such a stop cannot see escapes the wrapper
// never recorded that also gave up the logs, and its final record and
// reconcile say so (docs/design.md, "How a run is stopped"). The lease bound does not hold for them; what must
// hold is that the record does not claim otherwise (terminal-truth,
// reconcile-truth). The first time, the timeline says so.
func (p *player) unseenEscapes(idx int, r *runState, ps []proc.Stat) bool {
	b, err := os.ReadFile(filepath.Join(r.u.root, r.id, "status.json"))
	if err != nil || !sessionOnly(b) {
		return false
	}
	rec, err := statusfile.Parse(b)
	if err != nil || !statusfile.Terminal(rec.State) || rec.SID <= 1 {
		return false
	}
	listed := map[int]bool{}
	for _, e := range rec.Escaped {
		listed[e.PID] = true
	}
	logs := logFiles(filepath.Join(r.u.root, r.id))
	for _, s := range ps {
		if s.SID == rec.SID || listed[s.PID] || holdsLog(s.PID, logs) {
			return false
		}
	}
	p.mu.Lock()
	first := !r.violated["unseen-escapes"]
	r.violated["unseen-escapes"] = true
	p.mu.Unlock()
	if first {
		p.logf("run %d: %d escape(s) of its session alive past the bound; the record (%s, containment session) does not vouch for them, as the contract allows:\n%s",
			idx, len(ps), rec.State, indent(describe(ps)))
	}
	return true
}

// logFiles returns the identities of a run's stdout.log and stderr.log.
func logFiles(dir string) []os.FileInfo {
	var fis []os.FileInfo
	for _, name := range []string{"stdout.log", "stderr.log"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			fis = append(fis, fi)
		}
	}
	return fis
}

// holdsLog reports whether pid's fd 1 or 2 is one of logs: a process the
// contract says a stop from outside finds, whatever its session.
func holdsLog(pid int, logs []os.FileInfo) bool {
	for _, fd := range []string{"1", "2"} {
		fi, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd))
		if err != nil {
			continue
		}
		for _, l := range logs {
			if os.SameFile(fi, l) {
				return true
			}
		}
	}
	return false
}

// sessionOnly reports whether a record says its stop could only see the
// session (no cgroup, from outside the wrapper): then an empty survivors
// list is not a promise.
func sessionOnly(b []byte) bool {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	return m["containment"] == "session"
}

// judgeTerminal: a terminal record said nothing survived while ps were
// alive; two seconds later any process of the run still alive (the same
// ones, or new ones they forked) is a violation.
func (p *player) judgeTerminal(idx int, r *runState, rec *statusfile.Record, ps []proc.Stat) {
	select {
	case <-time.After(2 * time.Second):
	case <-p.quit:
		return
	}
	if still := p.scan()[idx]; len(still) > 0 {
		p.violate(CheckTerminalTruth, idx, "record %s (cause %q, exit %v) lists no survivors, but 2s after it was seen these run:\n%s",
			rec.State, rec.Cause, fmtInt(rec.ExitCode), describe(still))
	}
}

func fmtInt(p *int) string {
	if p == nil {
		return "none"
	}
	return strconv.Itoa(*p)
}

// finalChecks run once every run's bound has passed.
func (p *player) finalChecks() {
	live := p.scanTwice()
	for idx, r := range p.runs {
		if ps := live[idx]; len(ps) > 0 {
			p.mu.Lock()
			bound, how := p.boundOf(r)
			p.mu.Unlock()
			if p.unseenEscapes(idx, r, ps) {
				continue
			}
			if time.Now().Before(bound) && p.endedEarly {
				// The schedule ended early (another check failed): a run
				// still inside its bound is not judged alive "at the end".
				p.logf("run %d: still inside its bound (%s) when the schedule ended; not judged", idx, how)
				continue
			}
			p.violate(CheckEndNothingAlive, idx, "at the end (%s, bound %s: %s) these still run:\n%s", p.at(time.Now()), p.at(bound), how, describe(ps))
		}
	}
	// Each run's end checks ask agent-wrap (reconcile, settle): side by
	// side, one goroutine per run.
	var wg sync.WaitGroup
	for idx, r := range p.runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.endChecks(idx, r, live[idx])
		}()
	}
	wg.Wait()
}

// endChecks are the end checks of one run.
func (p *player) endChecks(idx int, r *runState, ps []proc.Stat) {
	dir := filepath.Join(r.u.root, r.id)
	p.mu.Lock()
	code, ended, gcd, torn := r.code, !r.ended.IsZero(), r.gcd, map[string]bool{}
	for k, v := range r.torn {
		torn[k] = v
	}
	p.mu.Unlock()
	_, derr := os.Lstat(dir)
	// A nested run's controller passes on its job's code, and its job is
	// a controller too: 125 may be the inner run's claim refused.
	if ended && code == 125 && derr == nil && r.spec.Shape != Nested {
		p.violate(CheckClaim, idx, "`run` exited 125 but left its directory %s: the ID is used up", dir)
	}
	if derr != nil {
		if gcd {
			p.logf("run %d: its directory was removed by gc; only the ledger is checked", idx)
		}
		if r.spec.SSH && p.ssh != nil {
			p.checkLedger(idx, r, "none")
		}
		return
	}
	b, err := os.ReadFile(filepath.Join(dir, "status.json"))
	// `run` SIGKILLed by the nemesis (exit -1) before its first record:
	// nothing could undo its claim, and nothing was started (the job
	// starts after the record). What must hold is that nothing of it runs
	// and reconcile does not call it over (reconcile-truth, below).
	killedInClaim := ended && code == -1 && errors.Is(err, fs.ErrNotExist) && !r.spec.SSH
	if err == nil {
		_, err = statusfile.Parse(b)
	}
	if killedInClaim && len(ps) > 0 {
		p.violate(CheckClaim, idx, "`run` was killed before its first record, yet these of the run are alive:\n%s", describe(ps))
	} else if killedInClaim {
		p.logf("run %d: `run` was killed in its claim: its directory is left with no record", idx)
	} else if err != nil && !torn["status.json"] && ended && code != 125 {
		p.violate(CheckClaim, idx, "`run` exited %d and the run has no readable record: %v", code, err)
	}
	if !torn["events.jsonl"] && !killedInClaim {
		p.checkJournal(idx, dir)
	}
	outcome := p.checkReconcile(idx, r, ps)
	if r.spec.SSH && p.ssh != nil {
		p.checkLedger(idx, r, outcome)
	}
}

func (p *player) checkJournal(idx int, dir string) {
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		p.violate(CheckJournal, idx, "%v", err)
		return
	}
	defer f.Close()
	if _, err := journal.Verify(f); err != nil {
		p.violate(CheckJournal, idx, "verify: %v", err)
		return
	}
	f.Seek(0, 0)
	es, err := journal.ReadAll(f)
	if err != nil {
		p.violate(CheckJournal, idx, "read: %v", err)
		return
	}
	// A stop whose intent could not be journaled (a read-only root) goes
	// ahead and journals intent_unrecorded once it can: maybe after its
	// first signal_sent (docs/reference.md, "When the disk breaks").
	unrecorded := false
	for _, e := range es {
		unrecorded = unrecorded || e.Event == "intent_unrecorded"
	}
	var seen []string
	for _, e := range es {
		if e.Event == "signal_sent" {
			ok := unrecorded
			for _, s := range seen {
				if s == "deadline_expired" || s == "cancel_requested" || s == "leader_exited" {
					ok = true
				}
			}
			if !ok {
				var all []string
				for _, e := range es {
					all = append(all, e.Event)
				}
				p.violate(CheckJournal, idx, "signal_sent (seq %d) with no intent before it, and no intent_unrecorded; events: %s", e.Seq, strings.Join(all, " "))
			}
			return
		}
		seen = append(seen, e.Event)
	}
}

// checkReconcile asks reconcile about a run and compares its verdict with
// what the harness sees.
func (p *player) checkReconcile(idx int, r *runState, ps []proc.Stat) string {
	code, out := p.exec(r.u, 60*time.Second, "reconcile", "--json", r.id)
	var v struct {
		Outcome    string `json:"outcome"`
		Reason     string `json:"reason"`
		Supervisor string `json:"supervisor"`
	}
	line := strings.TrimSpace(out)
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	if err := json.Unmarshal([]byte(line), &v); err != nil {
		p.violate(CheckReconcile, idx, "reconcile --json exited %d and printed no verdict: %v\n%s", code, err, out)
		return ""
	}
	p.logf("run %d: reconcile says %s (%s)", idx, v.Outcome, v.Reason)
	wrapperAlive := r.wrapper.PID > 1 && r.wrapper.Start != 0 && proc.Alive(r.wrapper.PID, r.wrapper.Start)
	switch {
	case v.Outcome == "running" && len(ps) == 0 && !wrapperAlive:
		p.violate(CheckReconcile, idx, "reconcile says running (%s) but no process of the run and no wrapper is alive", v.Reason)
	case (v.Outcome == "completed" || v.Outcome == "cancelled") && len(ps) > 0:
		p.violate(CheckReconcile, idx, "reconcile says %s (%s) while these run:\n%s", v.Outcome, v.Reason, describe(ps))
	}
	return v.Outcome
}

// gc runs `gc --older-than 1s` on u's root beside the live runs, and
// checks what it removed (gc-safe): no process of a removed run and not
// its wrapper may be alive after gc said it removed the run. A run gc
// removed is left out of the end checks that read its directory.
func (p *player) gc(u *userInfo) (bool, string) {
	code, out := p.exec(u, 60*time.Second, "gc", "--older-than", "1s")
	if code < 0 {
		return false, firstLine(out)
	}
	var removed []string
	for _, line := range strings.Split(out, "\n") {
		id, ok := strings.CutPrefix(line, "removed ")
		if !ok {
			continue
		}
		id, _, _ = strings.Cut(id, " ")
		for idx, r := range p.runs {
			if r.u != u || r.id != id {
				continue
			}
			removed = append(removed, id)
			p.mu.Lock()
			r.gcd = true
			w := r.wrapper
			p.mu.Unlock()
			ps := p.scanTwice()[idx]
			if w.PID > 1 && w.Start != 0 && proc.Alive(w.PID, w.Start) {
				p.violate(CheckGC, idx, "gc removed %s while its wrapper (pid %d) was alive", id, w.PID)
			}
			if len(ps) > 0 {
				p.violate(CheckGC, idx, "gc removed %s while these of it run:\n%s", id, describe(ps))
			}
		}
	}
	return true, fmt.Sprintf("exit %d, removed %d of ours %v", code, len(removed), removed)
}
