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
	root     string // its run root, where its runs' wrappers write
	view     string // the same root through the view mount: every other command's
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
	// recorded is when the harness first found the run's status.json,
	// whole or torn: a controller run's host side starts only after its
	// claim, which a stopped controller can put off past the lease.
	recorded time.Time

	deadline  time.Time // the lease's end as the harness knows it (zero: none seen yet)
	expiredAt time.Time // when the harness first saw the deadline passed
	lastDL    int64     // the last deadline_epoch read
	state     string    // the furthest state seen
	wrapper   proc.Identity
	torn      map[string]bool // files the harness tore
	terminal  bool
	gcd       bool // gc said it removed the run's directory
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
	view  string // the tmpfs bind-mounted again: what `ro` makes read-only
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
	pg        *pgSide        // nil: no controller run with a PostgreSQL ledger
	// endedEarly: the schedule was cut short (a check failed, the
	// campaign's time ran out) before every run's bound had passed.
	endedEarly bool
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
	// The view: the same tmpfs bind-mounted a second time. The runs'
	// wrappers (and so their jobs' open logs) use the tmpfs itself; every
	// other command (cancel, renew, watchdog, attach, reconcile) uses the
	// view, which the `ro` fault remounts read-only: a bind mount can be
	// made read-only while files are open for writing through the other.
	p.view = filepath.Join(base, "view")
	if err := os.Mkdir(p.view, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(p.mnt, p.view, "", unix.MS_BIND, ""); err != nil {
		p.view = ""
		return fmt.Errorf("bind-mount the tmpfs for the read-only view: %w", err)
	}
	rootUser := &userInfo{name: "root", root: filepath.Join(p.mnt, "root"), view: filepath.Join(p.view, "root")}
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
		other = &userInfo{name: u.Username, uid: uid, gid: gid, root: filepath.Join(p.mnt, "u"), view: filepath.Join(p.view, "u")}
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
		if rs.SSH && rs.PG && p.pg == nil {
			if p.pg, err = p.startPG(); err != nil {
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

// command is an agent-wrap command as u, in its own process group: `run`
// on u's root, every other command on its view (see setup).
func (p *player) command(u *userInfo, args ...string) *exec.Cmd {
	root := u.view
	if len(args) > 0 && args[0] == "run" {
		root = u.root
	}
	c := exec.Command(p.bin, append([]string{"--root", root}, args...)...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + u.root, "LANG=C"}
	if u.uid == 0 && p.ssh != nil {
		c.Env = append(c.Env, "AGENT_WRAP_MUX_DIR="+p.ssh.mux)
	}
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
				p.awaitPhase(r, st.Aim)
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
			p.endedEarly = true
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
			p.endedEarly = true
			break // the seed has failed: the end checks say what is still alive
		}
		if now > end+p.maxBound()+30*time.Second && p.boundsPassed() {
			break // the end check says what is still alive
		}
		if now > end+p.maxBound()+120*time.Second {
			break // a bound that keeps moving (a controller renewing) is capped here
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

// boundsPassed: the lease bound of every launched run is in the past. A
// controller's renewals move a run's bound later, and a run launched late
// (its controller stopped before its claim) is bounded from its own
// deadline, not from the schedule.
func (p *player) boundsPassed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, r := range p.runs {
		if r.launch.IsZero() {
			continue
		}
		if b, _ := p.boundOf(r); now.Before(b) {
			return false
		}
	}
	return true
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

// awaitPhase waits, when the fault's moment came before its run reached
// the phase the fault was aimed at, until the run gets there (a loaded
// machine starts runs late, a controller run's deadline moves with each
// renewal), or for a bound past which it fires anyway. The schedule draws
// the phase first and its moment from it; this keeps a fault in the phase
// it was drawn for, so that every fault × phase pair is hit, the narrow
// ones too (a controller between its host's final record and its own
// exit). A run already past its aim is hit at once, in its phase.
func (p *player) awaitPhase(r *runState, aim string) {
	bound := map[string]time.Duration{
		"running": 2 * time.Second,
		"grace":   r.spec.Lease + r.spec.Grace + 5*time.Second,
		"final":   r.spec.Lease + r.spec.Grace + 15*time.Second,
	}[aim]
	if bound == 0 {
		return
	}
	// Polled every 5 ms: a run whose job obeys TERM is in its grace
	// (cancelling) for a few tens of milliseconds.
	until := time.Now().Add(bound)
	for time.Now().Before(until) && phaseRank[p.phase(r)] < phaseRank[aim] && !p.neverClaimed(r) {
		select {
		case <-p.quit:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// neverClaimed: the run's `run` exited leaving no directory (a claim
// refused, a controller that launched nothing): it has no phase to wait for.
func (p *player) neverClaimed(r *runState) bool {
	select {
	case <-r.done:
	default:
		return false
	}
	_, err := os.Lstat(filepath.Join(r.u.root, r.id))
	return err != nil
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
