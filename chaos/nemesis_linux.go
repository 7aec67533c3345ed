package chaos

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

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
	case "kill-sshd", "stop-sshd", "kill-ssh-client", "stop-ssh-client", "kill-master", "stop-master":
		if p.ssh == nil {
			landed, note = false, "no sshd"
			break
		}
		var ids []proc.Identity
		find := func() bool {
			switch st.Fault[5:] {
			case "sshd":
				ids = p.ssh.sshdProcs(st.Fault == "stop-sshd")
			case "ssh-client":
				ids = p.ssh.clientsOf(p.controllerOf(r))
			case "master":
				ids = p.ssh.masters()
			}
			return len(ids) > 0
		}
		switch {
		case st.Fault[5:] == "ssh-client":
			// Between two calls of the controller: its next client may
			// live for milliseconds.
			ids = p.ssh.waitClients(p.controllerOf(r), 3*time.Second, p.quit)
			ph = p.phase(r)
		case !find():
			// Between two calls of the controller: wait a moment for
			// its next connection, or master.
			p.within(time.Second, nil, find) // a /proc scan each time: every 100 ms
			ph = p.phase(r)
		}
		landed, note = p.signalEach(ids, strings.HasPrefix(st.Fault, "kill-"), st.Pause)
	case "settle":
		if p.ssh == nil {
			landed, note = false, "no ledger"
			break
		}
		ledger := p.ssh.ledger
		if r.spec.PG && p.pg != nil {
			ledger = p.pg.url("") // the PostgreSQL ledger the run is in
		}
		code, out := p.exec(p.users[0], 60*time.Second, "settle", "--all", "--ledger", ledger)
		note = fmt.Sprintf("exit %d %s", code, firstLine(out))
	case "kill-pg-backend", "stop-pg-backend", "stop-postmaster":
		if p.pg == nil {
			landed, note = false, "no PostgreSQL"
			break
		}
		var ids []proc.Identity
		find := func() bool {
			if st.Fault == "stop-postmaster" {
				ids = nil
				if pm := p.pg.postmaster(); pm.PID > 1 {
					ids = []proc.Identity{pm}
				}
			} else {
				ids = p.pg.backendsOf(appOf(r))
			}
			return len(ids) > 0
		}
		if !find() {
			// The controller connects at its first ledger call and again
			// at its next one after its connection broke (a killed
			// backend resets every connection): wait for its next
			// heartbeat, at most a third of its --give-up apart.
			p.within((r.spec.Lease+r.spec.Grace+5*time.Second)/3+500*time.Millisecond, nil, find)
			ph = p.phase(r)
		}
		landed, note = p.signalEach(ids, st.Fault == "kill-pg-backend", st.Pause)
	case "kill-postmaster":
		if p.pg == nil {
			landed, note = false, "no PostgreSQL"
			break
		}
		landed, note = p.killPostmaster(st.Pause)
	case "gc":
		landed, note = p.gc(r.u)
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

// signalEach SIGKILLs each of ids, or stops each for pause; it reports
// whether any was hit, and which.
func (p *player) signalEach(ids []proc.Identity, kill bool, pause time.Duration) (bool, string) {
	var hit []string
	for _, id := range ids {
		var err error
		if kill {
			err = stop.Signal(id, unix.SIGKILL)
		} else {
			err = p.signalStop(id, pause)
		}
		if err == nil {
			hit = append(hit, fmt.Sprint(id.PID))
		}
	}
	if len(hit) == 0 {
		return false, fmt.Sprintf("none of %d alive", len(ids))
	}
	return true, "pid " + strings.Join(hit, ", ")
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
		err = unix.Mount("", p.view, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
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
		if err := unix.Mount("", p.view, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
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
	// Torn from the first attempt on: a write that fails (a full disk)
	// may already have truncated the file.
	p.mu.Lock()
	r.torn[name] = true
	p.mu.Unlock()
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
