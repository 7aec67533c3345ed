package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/stop"
)

// Config is what Play needs of the machine.
type Config struct {
	Bin      string        // the agent-wrap binary under test
	Interval time.Duration // the watchdog's --interval (default 1s)
	// Slack is added to the lease bound for a loaded machine (default 3s);
	// a violation prints the bound with it.
	Slack time.Duration
	// User is the second user's name: runs drawn as Other run as it, with
	// their own root and watchdog (no cgroup). "" plays them as root.
	User string
	// TmpfsSize is the size of the run roots' tmpfs (default 48m).
	TmpfsSize string
	Log       io.Writer // progress lines (nil: none)
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Slack <= 0 {
		c.Slack = 3 * time.Second
	}
	if c.TmpfsSize == "" {
		c.TmpfsSize = "48m"
	}
	return c
}

// Violation is one invariant seen broken.
type Violation struct {
	Checker  string        // the invariant's name
	Run      int           // the run (-1: the schedule as a whole)
	At       time.Duration // offset from the schedule's start
	Evidence string
}

func (v Violation) String() string {
	return fmt.Sprintf("VIOLATION %s, run %d, at +%.3fs:\n%s", v.Checker, v.Run, v.At.Seconds(), indent(v.Evidence))
}

// Result is what playing a schedule showed.
type Result struct {
	Schedule   Schedule
	Violations []Violation
	Coverage   *Coverage
	Timeline   []string // what the harness did and saw, with offsets
	Elapsed    time.Duration
	// Mount is where the run roots' tmpfs was mounted (unmounted when Play
	// returns).
	Mount string
}

// Failed reports whether any invariant was broken.
func (r *Result) Failed() bool { return len(r.Violations) > 0 }

// Report is the failure report: the seed, the schedule up to the first
// violation, every violation with its evidence, and the timeline.
func (r *Result) Report() string {
	var b strings.Builder
	first := r.Elapsed
	if len(r.Violations) > 0 {
		first = r.Violations[0].At
	}
	fmt.Fprintf(&b, "seed %d: %d violation(s); replay: %s\n", r.Schedule.Seed, len(r.Violations), r.Schedule.Replay())
	b.WriteString("schedule up to the first violation:\n")
	b.WriteString(indent(r.Schedule.Until(first)))
	for _, v := range r.Violations {
		b.WriteString(v.String())
		b.WriteString("\n")
	}
	b.WriteString("timeline:\n")
	for _, l := range r.Timeline {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}

// userInfo is who a run runs as.
type userInfo struct {
	name     string
	uid, gid int
	root     string // its run root
}

// runState is what the harness knows of one run, whatever the records say.
type runState struct {
	spec     RunSpec
	id       string
	u        *userInfo
	tag      string
	cmd      *exec.Cmd // the `run` process
	done     chan struct{}
	launched chan struct{} // closed once the launch was tried
	code     int           // exit of `run` once done
	launch   time.Time
	ended    time.Time // when `run` exited
	claimed  bool      // a record was seen

	deadline  time.Time // the lease's end as the harness knows it (zero: none seen yet)
	expiredAt time.Time // when the harness first saw the deadline passed
	lastDL    int64     // the last deadline_epoch read
	state     string    // the furthest state seen
	wrapper   proc.Identity
	torn      map[string]bool // files the harness tore
	terminal  bool
	judged    bool // terminal truth checked
	violated  map[string]bool
}

// player plays one schedule.
type player struct {
	cfg   Config
	s     Schedule
	cov   *Coverage
	t0    time.Time
	nonce string
	mnt   string
	base  string
	bin   string
	users []*userInfo

	mu        sync.Mutex
	runs      map[int]*runState
	res       *Result
	helpers   []*exec.Cmd // every agent-wrap process started, for cleanup
	stopped   map[int]uint64
	wds       map[*userInfo]*watchdog
	fillers   int
	readOnly  bool
	quit      chan struct{}
	shutdown  bool
	wg        sync.WaitGroup
	seenProcs map[int]tagged // the /proc scan's cache
	ssh       *sshSide       // nil: no controller runs
}

type tagged struct {
	start uint64
	comm  string
	run   int // -1: not a run's
}

// Play plays s on this machine and checks it. It returns an error when the
// harness itself could not work (no tmpfs, no binary); a broken invariant
// is a Violation in the Result.
func Play(ctx context.Context, cfg Config, s Schedule, cov *Coverage) (*Result, error) {
	cfg = cfg.withDefaults()
	if cov == nil {
		cov = NewCoverage()
	}
	p := &player{cfg: cfg, s: s, cov: cov, runs: map[int]*runState{}, stopped: map[int]uint64{},
		wds: map[*userInfo]*watchdog{}, quit: make(chan struct{}), seenProcs: map[int]tagged{},
		res: &Result{Schedule: s, Coverage: cov}}
	var nb [6]byte
	rand.Read(nb[:])
	p.nonce = hex.EncodeToString(nb[:])
	if err := p.setup(); err != nil {
		p.teardown()
		return nil, err
	}
	defer p.teardown()
	p.res.Mount = p.mnt
	p.t0 = time.Now()
	p.play(ctx)
	p.res.Elapsed = time.Since(p.t0)
	return p.res, nil
}

func (p *player) logf(format string, a ...any) {
	line := fmt.Sprintf("+%7.3fs ", time.Since(p.t0).Seconds()) + fmt.Sprintf(format, a...)
	p.mu.Lock()
	p.res.Timeline = append(p.res.Timeline, line)
	p.mu.Unlock()
	if p.cfg.Log != nil {
		fmt.Fprintln(p.cfg.Log, line)
	}
}

func (p *player) violate(checker string, run int, format string, a ...any) {
	p.mu.Lock()
	if r := p.runs[run]; r != nil {
		if r.violated[checker] {
			p.mu.Unlock()
			return // once per run and checker
		}
		r.violated[checker] = true
	}
	v := Violation{Checker: checker, Run: run, At: time.Since(p.t0), Evidence: fmt.Sprintf(format, a...)}
	p.res.Violations = append(p.res.Violations, v)
	p.mu.Unlock()
	p.logf("violation %s on run %d", checker, run)
}

// setup mounts the tmpfs, makes the roots and copies the binary where the
// second user can run it.
func (p *player) setup() error {
	base, err := os.MkdirTemp("", "awchaos-")
	if err != nil {
		return err
	}
	p.base = base
	if err := os.Chmod(base, 0o755); err != nil {
		return err
	}
	p.bin = filepath.Join(base, "agent-wrap")
	b, err := os.ReadFile(p.cfg.Bin)
	if err != nil {
		return fmt.Errorf("the binary under test: %w", err)
	}
	if err := os.WriteFile(p.bin, b, 0o755); err != nil {
		return err
	}
	p.mnt = filepath.Join(base, "mnt")
	if err := os.Mkdir(p.mnt, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", p.mnt, "tmpfs", 0, "size="+p.cfg.TmpfsSize+",mode=0755"); err != nil {
		p.mnt = ""
		return fmt.Errorf("mount a tmpfs for the run roots (needs root): %w", err)
	}
	rootUser := &userInfo{name: "root", root: filepath.Join(p.mnt, "root")}
	if err := os.Mkdir(rootUser.root, 0o700); err != nil {
		return err
	}
	p.users = append(p.users, rootUser)
	other := rootUser
	if p.cfg.User != "" {
		u, err := user.Lookup(p.cfg.User)
		if err != nil {
			return fmt.Errorf("the second user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		other = &userInfo{name: u.Username, uid: uid, gid: gid, root: filepath.Join(p.mnt, "u")}
		if err := os.Mkdir(other.root, 0o700); err != nil {
			return err
		}
		if err := os.Chown(other.root, uid, gid); err != nil {
			return err
		}
		p.users = append(p.users, other)
	}
	for _, rs := range p.s.Runs {
		if rs.SSH && p.ssh == nil {
			if p.ssh, err = p.startSSH(); err != nil {
				return err
			}
		}
		u := rootUser
		if rs.Other && !rs.SSH {
			u = other
		}
		p.runs[rs.Index] = &runState{spec: rs, u: u, id: fmt.Sprintf("r%d-%s", rs.Index, p.nonce[:6]),
			tag: fmt.Sprintf("AWCHAOS_TAG=%s.%d", p.nonce, rs.Index), done: make(chan struct{}), launched: make(chan struct{}),
			torn: map[string]bool{}, violated: map[string]bool{}}
	}
	return nil
}

// command is an agent-wrap command as u, in its own process group.
func (p *player) command(u *userInfo, args ...string) *exec.Cmd {
	c := exec.Command(p.bin, append([]string{"--root", u.root}, args...)...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + u.root, "LANG=C"}
	if u.uid != 0 {
		c.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}
	}
	c.Dir = "/"
	return c
}

// start starts c and remembers it for cleanup.
func (p *player) start(c *exec.Cmd) error {
	if err := c.Start(); err != nil {
		return err
	}
	p.mu.Lock()
	p.helpers = append(p.helpers, c)
	p.mu.Unlock()
	return nil
}

// exec runs an agent-wrap command to completion (bounded) and returns its
// exit code and output.
func (p *player) exec(u *userInfo, bound time.Duration, args ...string) (int, string) {
	c := p.command(u, args...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := p.start(c); err != nil {
		return -1, err.Error()
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
	case <-time.After(bound):
		c.Process.Kill()
		<-done
		return -2, fmt.Sprintf("%s did not exit within %v (killed)\n%s", strings.Join(args, " "), bound, out.String())
	}
	return c.ProcessState.ExitCode(), out.String()
}

// play launches the runs and fires the faults at their offsets, checks all
// the while, then waits for every run's bound and makes the final checks.
func (p *player) play(ctx context.Context) {
	for _, u := range p.users {
		if p.usedBy(u) {
			p.wds[u] = p.startWatchdog(u)
		}
	}
	checkDone := make(chan struct{})
	go func() { defer close(checkDone); p.checkLoop() }()

	var end time.Duration
	for _, rs := range p.s.Runs {
		rs := rs
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.sleepUntil(rs.At); p.launch(p.runs[rs.Index]) }()
		e := rs.At + rs.Lease + rs.Grace + 8*time.Second
		end = max(end, e)
	}
	for _, st := range p.s.Steps {
		st := st
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.sleepUntil(st.At)
			// Aimed at a moment of a run: counted from the run's real
			// launch, however late a loaded machine made it.
			if r := p.runs[st.Run]; r != nil {
				select {
				case <-r.launched:
				case <-p.quit:
					return
				}
				p.mu.Lock()
				at := r.launch.Add(st.At - r.spec.At)
				p.mu.Unlock()
				if r.spec.SSH && st.At > r.spec.At {
					// A controller run starts on the host only after its
					// connection: count from the host's first record.
					status := filepath.Join(r.u.root, r.id, "status.json")
					p.within(20*time.Second, r, func() bool { _, err := os.Lstat(status); return err == nil })
					at = time.Now().Add(st.At - r.spec.At)
				}
				if d := time.Until(at); d > 0 {
					select {
					case <-time.After(d):
					case <-p.quit:
						return
					}
				}
			}
			p.fault(st)
		}()
		if !strings.HasPrefix(st.Fault, "stop-") {
			// A stop may outlast the schedule: what it can break is seen
			// by the lease bound, and the stopped process is continued
			// before the end checks.
			end = max(end, st.At+st.Pause+time.Second)
		}
	}
	// Wait for the faults and launches, then for every run's bound.
	p.wg.Wait()
	for {
		if ctx.Err() != nil {
			break
		}
		now := time.Since(p.t0)
		if (now > end || p.allTerminal()) && p.allQuiet() {
			break // nothing left to happen: every fault fired, every run over
		}
		p.mu.Lock()
		failed := len(p.res.Violations) > 0
		p.mu.Unlock()
		if now > end && failed {
			break // the seed has failed: the end checks say what is still alive
		}
		if now > end+p.maxBound()+30*time.Second {
			break // the end check says what is still alive
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Continue what is still stopped, and let it finish (its wrapper's
	// final record, a cancel's answer) before the end checks.
	p.contAll()
	p.within(10*time.Second, nil, p.allQuiet)
	close(p.quit)
	<-checkDone
	p.finalChecks()
}

func (p *player) usedBy(u *userInfo) bool {
	for _, r := range p.runs {
		if r.u == u {
			return true
		}
	}
	return false
}

func (p *player) sleepUntil(at time.Duration) {
	if d := time.Until(p.t0.Add(at)); d > 0 {
		select {
		case <-time.After(d):
		case <-p.quit:
		}
	}
}

// maxBound is the longest lease bound of any run after its deadline.
func (p *player) maxBound() time.Duration {
	var m time.Duration
	for _, r := range p.runs {
		m = max(m, r.spec.Grace+p.cfg.Interval+3*time.Second+p.cfg.Slack)
	}
	return m
}

// allQuiet: every run's `run` has exited, its record is terminal or gone,
// and no process of any run is alive.
func (p *player) allQuiet() bool {
	live := p.scanTwice()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.runs {
		select {
		case <-r.done:
		default:
			return false
		}
		if len(live[r.spec.Index]) > 0 {
			return false
		}
	}
	return true
}

// allTerminal: every run's record is terminal, or its `run` exited
// leaving none (a claim refused, a controller that launched nothing).
func (p *player) allTerminal() bool {
	for _, r := range p.runs {
		select {
		case <-r.done:
		default:
			return false
		}
		rec, err := p.record(r)
		if err == nil && !statusfile.Terminal(rec.State) {
			return false
		}
		if err != nil {
			if _, derr := os.Lstat(filepath.Join(r.u.root, r.id)); derr == nil {
				return false // a record torn or not written: wait for the bound
			}
		}
	}
	return true
}

// shapeScript is the job of a shape: sh or python3, bounded in time so a
// survivor cannot outlive the campaign for long.
func shapeScript(shape string, code int) []string {
	switch shape {
	case "quick":
		return []string{"sh", "-c", fmt.Sprintf("exit %d", code%4)}
	case "pipeline":
		return []string{"sh", "-c", "sleep 60 & yes | head -c 200000 | cat >/dev/null; sleep 60 | cat"}
	case "setsid":
		return []string{"sh", "-c", "setsid sleep 61 & sleep 60"}
	case "termignore":
		return []string{"sh", "-c", "trap '' TERM; sleep 60 & sh -c 'trap \"\" TERM; sleep 60'; wait"}
	case "forkloop":
		return []string{"python3", "-c", `
import os, time
end = time.time() + 45
while time.time() < end:
    pid = os.fork()
    if pid == 0:
        time.sleep(0.2)
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0: pass
    except ChildProcessError: pass
    time.sleep(0.01)
`}
	case "walker":
		// One chain at a time (never more: each parent exits as soon as
		// its child exists), for a bounded time, beside a sleeping leader.
		return []string{"python3", "-c", `
import os, time
end = time.time() + 45
if os.fork() == 0:
    while time.time() < end:
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        time.sleep(0.002)
    os._exit(0)
time.sleep(60)
`}
	case "bigoutput":
		return []string{"sh", "-c", "head -c 8000000 /dev/zero | tr '\\0' x; sleep 60"}
	default: // sleeper
		return []string{"sleep", "60"}
	}
}

// launch starts a run's `run` command.
func (p *player) launch(r *runState) {
	rs := r.spec
	args := []string{"run", "--lease", fmt.Sprint(rs.Lease), "--grace", fmt.Sprint(rs.Grace)}
	if rs.Fg {
		args = append(args, "--no-stream")
	} else {
		args = append(args, "--detach")
	}
	args = append(args, r.id, "--", "env", r.tag)
	args = append(args, shapeScript(rs.Shape, rs.Index)...)
	if rs.SSH {
		args = p.sshArgs(r)
	}
	c := p.command(r.u, args...)
	c.Stdout, c.Stderr = io.Discard, io.Discard
	var errb bytes.Buffer
	c.Stderr = &errb
	p.mu.Lock()
	r.launch = time.Now()
	r.cmd = c
	p.mu.Unlock()
	defer close(r.launched)
	if err := p.start(c); err != nil {
		p.logf("run %d: cannot start: %v", rs.Index, err)
		r.code = -1
		close(r.done)
		return
	}
	p.cov.Run()
	p.logf("run %d launched as %s (pid %d): %s", rs.Index, r.u.name, c.Process.Pid, strings.Join(args, " "))
	go func() {
		c.Wait()
		p.mu.Lock()
		r.code = c.ProcessState.ExitCode()
		r.ended = time.Now()
		p.mu.Unlock()
		p.logf("run %d: `run` exited %d %s", rs.Index, r.code, firstLine(errb.String()))
		close(r.done)
	}()
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if s != "" {
		return "(" + s + ")"
	}
	return ""
}

// record reads the run's status.json (nil if missing or unreadable).
func (p *player) record(r *runState) (*statusfile.Record, error) {
	b, err := os.ReadFile(filepath.Join(r.u.root, r.id, "status.json"))
	if err != nil {
		return nil, err
	}
	return statusfile.Parse(b)
}

// phase is the phase of a run as seen now.
func (p *player) phase(r *runState) string {
	rec, err := p.record(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || rec == nil {
		if r.claimed {
			// a torn or vanished record: its last known state
			return phaseOf(r.state, r.deadline)
		}
		return "claim"
	}
	ph := phaseOf(rec.State, r.deadline)
	if ph == "running" {
		// The first moments of a running record are still the start: the
		// pid, pgid and deadline files, the detach's answer.
		if t, err := time.Parse(time.RFC3339Nano, rec.StartedAt); err == nil && time.Since(t) < startWindow {
			ph = "start"
		}
	}
	return ph
}

// startWindow is how long after started_at a run counts as starting.
const startWindow = 300 * time.Millisecond

func phaseOf(state string, deadline time.Time) string {
	switch state {
	case "", statusfile.Starting:
		if state == "" {
			return "claim"
		}
		return "start"
	case statusfile.Running:
		if !deadline.IsZero() && time.Now().After(deadline) {
			return "grace"
		}
		return "running"
	case statusfile.Cancelling:
		return "grace"
	default:
		return "final"
	}
}

// wrapperOf is the identity of the run's wrapper: the record's, or, before
// there is one, the `run` process itself.
func (p *player) wrapperOf(r *runState) proc.Identity {
	if rec, err := p.record(r); err == nil && rec.WrapperPID > 1 {
		return proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.wrapper.PID > 1 {
		return r.wrapper
	}
	if r.cmd != nil && r.cmd.Process != nil && !r.spec.SSH {
		select {
		case <-r.done:
		default:
			if st, err := proc.ReadStat(r.cmd.Process.Pid); err == nil {
				return proc.Identity{PID: st.PID, Start: st.Start}
			}
		}
	}
	return proc.Identity{}
}

// controllerOf is the identity of a controller run's `agent-wrap ssh`
// while it runs.
func (p *player) controllerOf(r *runState) proc.Identity {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !r.spec.SSH || r.cmd == nil || r.cmd.Process == nil {
		return proc.Identity{}
	}
	select {
	case <-r.done:
		return proc.Identity{}
	default:
	}
	st, err := proc.ReadStat(r.cmd.Process.Pid)
	if err != nil {
		return proc.Identity{}
	}
	return proc.Identity{PID: st.PID, Start: st.Start}
}

// signalStop SIGSTOPs id and SIGCONTs it after pause (or at teardown).
func (p *player) signalStop(id proc.Identity, pause time.Duration) error {
	if err := stop.Signal(id, unix.SIGSTOP); err != nil {
		return err
	}
	p.mu.Lock()
	p.stopped[id.PID] = id.Start
	p.mu.Unlock()
	go func() {
		select {
		case <-time.After(pause):
		case <-p.quit:
		}
		p.cont(id)
	}()
	return nil
}

func (p *player) cont(id proc.Identity) {
	p.mu.Lock()
	_, ok := p.stopped[id.PID]
	delete(p.stopped, id.PID)
	p.mu.Unlock()
	if ok {
		_ = stop.Signal(id, unix.SIGCONT)
	}
}

// contAll continues every process the nemesis stopped.
func (p *player) contAll() {
	p.mu.Lock()
	var stopped []proc.Identity
	for pid, start := range p.stopped {
		stopped = append(stopped, proc.Identity{PID: pid, Start: start})
	}
	p.mu.Unlock()
	for _, id := range stopped {
		p.cont(id)
	}
}

// fault fires one step.
func (p *player) fault(st Step) {
	r := p.runs[st.Run]
	if r == nil {
		return
	}
	ph := p.phase(r)
	landed := true
	note := ""
	switch st.Fault {
	case "kill-wrapper", "stop-wrapper":
		id := p.wrapperOf(r)
		if id.PID <= 1 {
			// Before the record names it: wait a moment for it.
			p.within(500*time.Millisecond, r, func() bool { id = p.wrapperOf(r); return id.PID > 1 })
			ph = p.phase(r)
		}
		if id.PID <= 1 {
			landed, note = false, "no wrapper"
			break
		}
		var err error
		if st.Fault == "kill-wrapper" {
			err = stop.Signal(id, unix.SIGKILL)
		} else {
			err = p.signalStop(id, st.Pause)
		}
		if err != nil {
			landed, note = false, err.Error()
		} else {
			note = fmt.Sprintf("pid %d", id.PID)
		}
	case "kill-cancel", "stop-cancel", "kill-renew", "stop-renew", "kill-attach", "stop-attach":
		verb := st.Fault[5:]
		args := map[string][]string{
			"cancel": {"cancel", "--wait", "10s", r.id},
			"renew":  {"renew", r.id},
			"attach": {"attach", r.id},
		}[verb]
		c := p.command(r.u, args...)
		c.Stdout, c.Stderr = io.Discard, io.Discard
		if err := p.start(c); err != nil {
			landed, note = false, err.Error()
			break
		}
		ch := make(chan struct{})
		go func() { c.Wait(); close(ch) }()
		st0, err := proc.ReadStat(c.Process.Pid)
		select {
		case <-time.After(time.Duration(st.Arg) * time.Millisecond):
		case <-ch:
		}
		select {
		case <-ch:
			landed, note = false, verb+" exited first"
		default:
			id := proc.Identity{PID: c.Process.Pid, Start: st0.Start}
			if err != nil {
				id.Start = 0
			}
			if strings.HasPrefix(st.Fault, "kill-") {
				err = stop.Signal(id, unix.SIGKILL)
			} else {
				err = p.signalStop(id, st.Pause)
			}
			if err != nil {
				landed, note = false, err.Error()
			} else {
				note = fmt.Sprintf("%s pid %d after %dms", verb, id.PID, st.Arg)
			}
		}
	case "kill-watchdog", "stop-watchdog":
		w := p.wds[r.u]
		if w == nil {
			landed, note = false, "no watchdog"
			break
		}
		if !w.hit(p, st.Fault == "kill-watchdog", st.Pause) {
			landed, note = false, "watchdog not running"
		}
	case "cut", "blackhole":
		if p.ssh == nil {
			landed, note = false, "no relay"
			break
		}
		if st.Fault == "cut" {
			p.ssh.relay.Cut()
			break
		}
		p.ssh.relay.Blackhole(true)
		go func() {
			select {
			case <-time.After(st.Pause):
			case <-p.quit:
			}
			p.ssh.relay.Blackhole(false)
		}()
		note = fmt.Sprintf("for %v", st.Pause)
	case "kill-controller", "stop-controller":
		id := p.controllerOf(r)
		if id.PID <= 1 {
			landed, note = false, "no controller"
			break
		}
		var err error
		if st.Fault == "kill-controller" {
			err = stop.Signal(id, unix.SIGKILL)
		} else {
			err = p.signalStop(id, st.Pause)
		}
		if err != nil {
			landed, note = false, err.Error()
		} else {
			note = fmt.Sprintf("pid %d", id.PID)
		}
	case "fill":
		note = p.fill(st.Pause)
	case "ro":
		landed, note = p.readOnlyFor(st.Pause)
	case "tear-status", "tear-deadline", "tear-journal":
		name := map[string]string{"tear-status": "status.json", "tear-deadline": "deadline_epoch", "tear-journal": "events.jsonl"}[st.Fault]
		if _, err := os.Lstat(filepath.Join(r.u.root, r.id, name)); err != nil {
			// Before the file exists: wait a moment for it.
			p.within(500*time.Millisecond, r, func() bool { _, err := os.Lstat(filepath.Join(r.u.root, r.id, name)); return err == nil })
			ph = p.phase(r)
		}
		landed, note = p.tear(r, name, st.Arg)
	case "cancel", "cancel2":
		n := 1
		if st.Fault == "cancel2" {
			n = 2
		}
		for i := 0; i < n; i++ {
			go func() {
				code, out := p.exec(r.u, 60*time.Second, "cancel", "--wait", "15s", r.id)
				p.logf("run %d: cancel exited %d %s", st.Run, code, firstLine(out))
			}()
		}
	case "renew":
		t := time.Now()
		code, out := p.exec(r.u, 30*time.Second, "renew", r.id)
		if code == 0 {
			p.mu.Lock()
			// renew set deadline = now + lease at some moment before it
			// returned: the latest it can be.
			dl := time.Now().Add(r.spec.Lease).Add(time.Second)
			if dl.After(r.deadline) {
				r.deadline = dl
			}
			p.mu.Unlock()
		}
		note = fmt.Sprintf("exit %d after %v %s", code, time.Since(t).Round(time.Millisecond), firstLine(out))
	}
	if landed {
		p.cov.Hit(st.Fault, ph)
	} else {
		p.cov.Miss(st.Fault)
	}
	p.logf("fault %s on run %d in phase %s (aimed %s): landed %v %s", st.Fault, st.Run, ph, st.Aim, landed, note)
}

// within polls cond for up to d, while r's `run` has not exited (any r
// nil: for the whole d).
func (p *player) within(d time.Duration, r *runState, cond func() bool) {
	var done chan struct{}
	poll := 100 * time.Millisecond // a /proc scan each time
	if r != nil {
		done, poll = r.done, 10*time.Millisecond
	}
	until := time.Now().Add(d)
	for time.Now().Before(until) && !cond() {
		select {
		case <-done:
			return
		case <-p.quit:
			return
		case <-time.After(poll):
		}
	}
}

// fill takes every free byte of the tmpfs and gives it back after pause.
func (p *player) fill(pause time.Duration) string {
	p.mu.Lock()
	p.fillers++
	name := filepath.Join(p.mnt, fmt.Sprintf("filler.%d", p.fillers))
	p.mu.Unlock()
	f, err := os.Create(name)
	if err != nil {
		return "cannot create the filler: " + err.Error()
	}
	chunk := bytes.Repeat([]byte{'f'}, 1<<16)
	n := 0
	for _, sz := range []int{1 << 16, 4096, 64} {
		for {
			w, err := f.Write(chunk[:sz])
			n += w
			if err != nil {
				break
			}
		}
	}
	f.Close()
	go func() {
		select {
		case <-time.After(pause):
		case <-p.quit:
		}
		os.Remove(name)
	}()
	return fmt.Sprintf("%d bytes", n)
}

// readOnlyFor remounts the tmpfs read-only and back after pause. A tmpfs
// with files open for writing cannot be remounted read-only (EBUSY): it is
// tried again until the pause is over.
func (p *player) readOnlyFor(pause time.Duration) (bool, string) {
	until := time.Now().Add(pause)
	var err error
	for time.Now().Before(until) {
		err = unix.Mount("", p.mnt, "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return false, "remount read-only: " + err.Error()
	}
	p.mu.Lock()
	p.readOnly = true
	p.mu.Unlock()
	go func() {
		select {
		case <-time.After(time.Until(until)):
		case <-p.quit:
		}
		p.readWrite()
	}()
	return true, fmt.Sprintf("read-only until +%.3fs", until.Sub(p.t0).Seconds())
}

func (p *player) readWrite() {
	p.mu.Lock()
	ro := p.readOnly
	p.readOnly = false
	p.mu.Unlock()
	if ro {
		if err := unix.Mount("", p.mnt, "", unix.MS_REMOUNT, ""); err != nil {
			p.logf("remount read-write: %v", err)
		}
	}
}

// tear damages a file of the run: 0 cuts its last 3 bytes, 1 writes
// garbage over it, 2 empties it.
func (p *player) tear(r *runState, name string, mode int) (bool, string) {
	path := filepath.Join(r.u.root, r.id, name)
	fi, err := os.Lstat(path)
	if err != nil {
		return false, err.Error()
	}
	switch mode {
	case 0:
		err = os.Truncate(path, max(fi.Size()-3, 0))
	case 1:
		err = os.WriteFile(path, []byte("{\"sch"), 0o600)
	default:
		err = os.Truncate(path, 0)
	}
	if err != nil {
		return false, err.Error()
	}
	p.mu.Lock()
	r.torn[name] = true
	p.mu.Unlock()
	return true, fmt.Sprintf("%s mode %d", name, mode)
}

// watchdog is the root's watchdog loop, restarted a moment after it dies
// (as systemd's Restart= would), with the time it was down or stopped.
type watchdog struct {
	u    *userInfo
	mu   sync.Mutex
	cmd  *exec.Cmd
	id   proc.Identity
	down []span // when it was not watching
	out  bytes.Buffer
}

type span struct{ from, to time.Time }

func (p *player) startWatchdog(u *userInfo) *watchdog {
	w := &watchdog{u: u}
	go func() {
		for {
			c := p.command(u, "watchdog", "--interval", p.cfg.Interval.String())
			c.Stdout, c.Stderr = io.Discard, io.Discard
			if err := p.start(c); err != nil {
				p.logf("watchdog for %s: %v", u.name, err)
				return
			}
			st, _ := proc.ReadStat(c.Process.Pid)
			w.mu.Lock()
			w.cmd, w.id = c, proc.Identity{PID: c.Process.Pid, Start: st.Start}
			if n := len(w.down); n > 0 && w.down[n-1].to.IsZero() {
				w.down[n-1].to = time.Now()
			}
			w.mu.Unlock()
			c.Wait()
			w.mu.Lock()
			w.down = append(w.down, span{from: time.Now()})
			w.cmd = nil
			w.mu.Unlock()
			select {
			case <-p.quit:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

// hit SIGKILLs the watchdog, or stops it for pause; it reports whether
// one was running.
func (w *watchdog) hit(p *player, kill bool, pause time.Duration) bool {
	w.mu.Lock()
	c, id := w.cmd, w.id
	w.mu.Unlock()
	if c == nil {
		return false
	}
	if kill {
		return stop.Signal(id, unix.SIGKILL) == nil
	}
	if err := p.signalStop(id, pause); err != nil {
		return false
	}
	w.mu.Lock()
	w.down = append(w.down, span{from: time.Now(), to: time.Now().Add(pause)})
	w.mu.Unlock()
	return true
}

// downSince is how long the watchdog was not watching since t.
func (w *watchdog) downSince(t time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	now := time.Now()
	for _, s := range w.down {
		to := s.to
		if to.IsZero() || to.After(now) {
			to = now
		}
		from := s.from
		if from.Before(t) {
			from = t
		}
		if to.After(from) {
			d += to.Sub(from)
		}
	}
	return d
}

// scan finds every live process of every run: a process whose environment
// carries the run's tag, which the job got from the harness and every
// descendant inherits whatever its group or session. The answer does not
// depend on any record the checks judge.
func (p *player) scan() map[int][]proc.Stat {
	all, _ := proc.Scan()
	out := map[int][]proc.Stat{}
	prefix := []byte("AWCHAOS_TAG=" + p.nonce + ".")
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[int]bool{}
	for _, st := range all {
		seen[st.PID] = true
		if st.Dead() {
			continue
		}
		c, ok := p.seenProcs[st.PID]
		if !ok || c.start != st.Start || c.comm != st.Comm {
			c = tagged{start: st.Start, comm: st.Comm, run: -1}
			if env, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/environ"); err == nil {
				for _, kv := range bytes.Split(env, []byte{0}) {
					if bytes.HasPrefix(kv, prefix) {
						if n, err := strconv.Atoi(string(kv[len(prefix):])); err == nil {
							c.run = n
						}
					}
				}
			}
			p.seenProcs[st.PID] = c
		}
		if c.run >= 0 {
			out[c.run] = append(out[c.run], st)
		}
	}
	for pid := range p.seenProcs {
		if !seen[pid] {
			delete(p.seenProcs, pid)
		}
	}
	return out
}

// scanTwice is two scans 30 ms apart, merged: one can miss a walker
// between its exit and its child's first appearance in /proc.
func (p *player) scanTwice() map[int][]proc.Stat {
	a := p.scan()
	time.Sleep(30 * time.Millisecond)
	for run, ps := range p.scan() {
		seen := map[int]bool{}
		for _, s := range a[run] {
			seen[s.PID] = true
		}
		for _, s := range ps {
			if !seen[s.PID] {
				a[run] = append(a[run], s)
			}
		}
	}
	return a
}

func describe(ps []proc.Stat) string {
	var b strings.Builder
	for _, s := range ps {
		argv, _ := proc.Cmdline(s.PID)
		fmt.Fprintf(&b, "pid %d (%s) state %c pgid %d sid %d\n", s.PID, strings.Join(argv, " "), s.State, s.PGID, s.SID)
	}
	return b.String()
}

// teardown stops everything the schedule started, by recorded identity:
// stopped processes are continued, every run's processes (found by tag)
// and recorded cgroup killed, every agent-wrap process the harness started
// killed, and the tmpfs unmounted.
func (p *player) teardown() {
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		return
	}
	p.shutdown = true
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	p.mu.Unlock()
	p.contAll()
	if p.mnt != "" {
		p.readWrite()
	}
	// The runs: wrappers, cgroups, then every tagged process until none.
	for _, r := range p.runs {
		if rec, err := p.record(r); err == nil {
			if rec.WrapperPID > 1 {
				_ = stop.Signal(proc.Identity{PID: rec.WrapperPID, Start: rec.WrapperStart}, unix.SIGKILL)
			}
			if rec.Cgroup != "" {
				_ = stop.KillCgroup(rec.Cgroup)
			}
		}
		if r.wrapper.PID > 1 {
			_ = stop.Signal(r.wrapper, unix.SIGKILL)
		}
	}
	p.mu.Lock()
	helpers := append([]*exec.Cmd(nil), p.helpers...)
	p.mu.Unlock()
	for _, c := range helpers {
		if c.Process != nil && c.ProcessState == nil {
			_ = c.Process.Kill() // our unreaped child: its PID is still its
		}
	}
	// A scan can miss a walker between its exit and its child's first
	// appearance in /proc: done only after two empty scans in a row.
	deadline := time.Now().Add(60 * time.Second)
	for empty := 0; empty < 2 && time.Now().Before(deadline); {
		live := p.scan()
		if len(live) == 0 {
			empty++
			time.Sleep(20 * time.Millisecond)
			continue
		}
		empty = 0
		// Freeze first, then kill: a walker found by PID has forked its
		// next self by the time a KILL lands, a stopped one has not.
		for _, ps := range live {
			for _, s := range ps {
				_ = stop.Signal(proc.Identity{PID: s.PID, Start: s.Start}, unix.SIGSTOP)
			}
		}
		for _, ps := range live {
			for _, s := range ps {
				_ = stop.Signal(proc.Identity{PID: s.PID, Start: s.Start}, unix.SIGKILL)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if live := p.scan(); len(live) > 0 {
		for run, ps := range live {
			fmt.Fprintf(os.Stderr, "awchaos: teardown could not kill run %d:\n%s", run, describe(ps))
		}
	}
	if p.ssh != nil {
		p.ssh.h.close() // the relay, then sshd and its per-connection processes, by recorded PID
	}
	for _, r := range p.runs {
		if rec, err := p.record(r); err == nil && rec.Cgroup != "" {
			_ = os.Remove(rec.Cgroup)
		}
	}
	if p.mnt != "" {
		if err := unix.Unmount(p.mnt, 0); err != nil {
			_ = unix.Unmount(p.mnt, unix.MNT_DETACH)
		}
	}
	if p.base != "" {
		os.RemoveAll(p.base)
	}
}
