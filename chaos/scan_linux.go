package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
)

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
	if p.view != "" {
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
		// The controllers' masters, which outlive a killed controller
		// (ControlPersist), by their recorded PID and start time.
		for _, id := range p.ssh.masters() {
			_ = stop.Signal(id, unix.SIGKILL)
		}
		p.ssh.h.close() // the relay, then sshd and its per-connection processes, by recorded PID
	}
	if p.pg != nil {
		p.pg.up(30 * time.Second) // a restart after kill-postmaster, under way, is not left behind
		p.pg.srv.Stop()           // by the PID it started (continued above if stopped), and its directory
	}
	for _, r := range p.runs {
		if rec, err := p.record(r); err == nil && rec.Cgroup != "" {
			_ = os.Remove(rec.Cgroup)
		}
	}
	if p.view != "" {
		if err := unix.Unmount(p.view, 0); err != nil {
			_ = unix.Unmount(p.view, unix.MNT_DETACH)
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
