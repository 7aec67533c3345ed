package membership_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// start runs argv in a session of its own (setsid) or, with setsid false,
// in a group of its own in the test's session.
func start(t *testing.T, setsid bool, argv ...string) proc.Stat {
	t.Helper()
	return runtest.Spawn(t, &unix.SysProcAttr{Setsid: setsid, Setpgid: !setsid}, argv...)
}

// childOf waits for the first child of pid and returns it.
func childOf(t *testing.T, pid int) proc.Stat {
	t.Helper()
	var child proc.Stat
	runtest.Eventually(t, "a child of "+strconv.Itoa(pid), func() bool {
		all, err := proc.Scan()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range all {
			if p.PPID == pid && !p.Dead() {
				child = p
				return true
			}
		}
		return false
	})
	return child
}

// record is what a wrapper records for a job led by leader.
func record(t *testing.T, leader proc.Stat) *statusfile.Record {
	t.Helper()
	boot, err := proc.BootID()
	if err != nil {
		t.Fatal(err)
	}
	return &statusfile.Record{RunID: "m-1", State: statusfile.Running, PID: leader.PID, PGID: leader.PID, SID: leader.PID,
		LeaderStart: leader.Start, BootID: boot}
}

func pids(ms []membership.Member) []int {
	var out []int
	for _, m := range ms {
		out = append(out, m.PID)
	}
	return out
}

func wantMember(t *testing.T, r membership.Run, p proc.Stat, escaped bool) {
	t.Helper()
	m, err := r.Contains(p.PID, p.Start)
	if err != nil {
		t.Fatalf("Contains(%d): %v, want a member", p.PID, err)
	}
	if m.Escaped != escaped || m.Identity.PID != p.PID || m.Identity.Start != p.Start {
		t.Fatalf("Contains(%d) = %+v, want escaped %v and its identity", p.PID, m, escaped)
	}
}

func wantStranger(t *testing.T, r membership.Run, pid int, start uint64, reason string) {
	t.Helper()
	_, err := r.Contains(pid, start)
	if !errors.Is(err, membership.ErrNotMember) || !strings.Contains(err.Error(), reason) {
		t.Fatalf("Contains(%d, %d): %v, want ErrNotMember saying %q", pid, start, err, reason)
	}
}

// A group member (the leader and its child) is the run's, with an identity
// that pins its group, session and start; the test itself, a process with
// the right PID but another start time, and a zombie are not.
func TestGroupMembers(t *testing.T) {
	leader := start(t, true, "sh", "-c", "sleep 600 & wait")
	child := childOf(t, leader.PID)
	r := membership.Run{Record: record(t, leader)}

	wantMember(t, r, leader, false)
	wantMember(t, r, child, false)
	m, _ := r.Contains(child.PID, child.Start)
	if m.Identity.PGID != leader.PID || m.Identity.SID != leader.PID || m.Identity.MinStart != leader.Start {
		t.Fatalf("a group member's identity does not pin the group: %+v", m.Identity)
	}
	self, _ := proc.ReadStat(os.Getpid())
	wantStranger(t, r, self.PID, self.Start, "not in the run's")
	wantStranger(t, r, child.PID, child.Start+1, "another process")
	wantStranger(t, r, child.PID, 0, "no start time")

	ms, rejected, err := r.Members()
	if err != nil {
		t.Fatal(err)
	}
	if got := pids(ms); len(got) != 2 || got[0] != min(leader.PID, child.PID) || got[1] != max(leader.PID, child.PID) {
		t.Fatalf("Members = %v, want the leader %d and its child %d", got, leader.PID, child.PID)
	}
	if len(rejected) != 0 {
		t.Fatalf("rejected %v", rejected)
	}

	// A zombie runs nothing: kill the child; the shell does not reap it
	// until it is woken, and the zombie is no member meanwhile.
	if err := unix.Kill(child.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the child to be dead", func() bool { return !proc.Alive(child.PID, child.Start) })
	if _, err := r.Contains(child.PID, child.Start); !errors.Is(err, membership.ErrNotMember) {
		t.Fatalf("a dead child: %v, want ErrNotMember", err)
	}
}

// A record from another boot makes nobody a member.
func TestOtherBoot(t *testing.T) {
	leader := start(t, true, "sleep", "600")
	rec := record(t, leader)
	rec.BootID = "00000000-0000-0000-0000-000000000000"
	wantStranger(t, membership.Run{Record: rec}, leader.PID, leader.Start, "host rebooted")
}

// When the process at the leader's PID has another start time, the group
// number was recycled: its members are rejected, with the reason.
func TestReusedGroupNumber(t *testing.T) {
	leader := start(t, true, "sh", "-c", "sleep 600 & wait")
	child := childOf(t, leader.PID)
	rec := record(t, leader)
	rec.LeaderStart = leader.Start - 1 // the recorded leader started earlier
	r := membership.Run{Record: rec}
	wantStranger(t, r, child.PID, child.Start, "not in the run's")
	ms, rejected, err := r.Members()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 0 || len(rejected) == 0 || !strings.Contains(strings.Join(rejected, "\n"), "PID reused") {
		t.Fatalf("Members = %v, rejected %q; want none, and the reuse named", pids(ms), rejected)
	}
}

// A recorded escape is the run's while its start time matches; another
// process at its PID is rejected.
func TestRecordedEscape(t *testing.T) {
	leader := start(t, true, "sleep", "600")
	esc := start(t, true, "sleep", "600")
	rec := record(t, leader)
	rec.Escaped = []statusfile.Escaped{{PID: esc.PID, PGID: esc.PID, SID: esc.PID, Start: esc.Start}}
	r := membership.Run{Record: rec}
	wantMember(t, r, esc, true)
	m, _ := r.Contains(esc.PID, esc.Start)
	if m.Identity.PGID != 0 || m.Identity.SID != 0 {
		t.Fatalf("an escape's identity must not pin the run's group: %+v", m.Identity)
	}

	rec.Escaped[0].Start = esc.Start - 1
	wantStranger(t, r, esc.PID, esc.Start, "PID reused")
	_, rejected, err := r.Members()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rejected, "\n"), "recorded as escaped") {
		t.Fatalf("rejected %q, want the reused escape named", rejected)
	}
}

// For the run's own wrapper (Supervisor), every descendant is the run's,
// recorded or not; from outside, an unrecorded escape is not.
func TestSupervisorDescendants(t *testing.T) {
	leader := start(t, true, "sleep", "600")
	esc := start(t, true, "sh", "-c", "sleep 600 & wait")
	grandchild := childOf(t, esc.PID)
	rec := record(t, leader)
	inside := membership.Run{Record: rec, Supervisor: os.Getpid()}
	wantMember(t, inside, esc, true)
	wantMember(t, inside, grandchild, true)
	ms, _ := inside.Judge(mustScan(t))
	if got := pids(ms); len(got) < 3 {
		t.Fatalf("Judge as the supervisor = %v, want the leader, %d and %d", got, esc.PID, grandchild.PID)
	}
	self, _ := proc.ReadStat(os.Getpid())
	wantStranger(t, inside, self.PID, self.Start, "not in the run's")

	outside := membership.Run{Record: rec}
	wantStranger(t, outside, grandchild.PID, grandchild.Start, "not in the run's")
}

// From outside, without a cgroup: a process a member forked that left the
// session unrecorded is the run's by its parent, and so is every
// descendant of the run's wrapper while that wrapper lives with its
// recorded start time; a wrapper PID with another start time vouches for
// nothing.
func TestOutsideOffspring(t *testing.T) {
	leader := start(t, true, "sh", "-c", "setsid sleep 600 & wait")
	esc := childOf(t, leader.PID)
	// It leaves the group start's cleanup kills: its own is killed here,
	// by its start time.
	t.Cleanup(func() { runtest.KillGroup(esc.PID, esc.Start) })
	runtest.Eventually(t, "the child to leave the session", func() bool {
		s, err := proc.ReadStat(esc.PID)
		esc = s
		return err == nil && s.SID == s.PID
	})
	rec := record(t, leader)
	outside := membership.Run{Record: rec}
	wantMember(t, outside, esc, true)
	if ms, _ := outside.Judge(mustScan(t)); !slices.Contains(pids(ms), esc.PID) {
		t.Fatalf("Judge from outside = %v, want the unrecorded escape %d", pids(ms), esc.PID)
	}

	// The test stands in for the wrapper: an orphan it holds is the
	// run's while it is the recorded wrapper.
	orphan := start(t, true, "sh", "-c", "sleep 600 & wait")
	grandchild := childOf(t, orphan.PID)
	self, _ := proc.ReadStat(os.Getpid())
	rec.WrapperPID, rec.WrapperStart = self.PID, self.Start
	wantMember(t, outside, orphan, true)
	wantMember(t, outside, grandchild, true)
	if ms, _ := outside.Judge(mustScan(t)); !slices.Contains(pids(ms), grandchild.PID) || slices.Contains(pids(ms), self.PID) {
		t.Fatalf("Judge from outside = %v, want %d below the wrapper %d and not the wrapper", pids(ms), grandchild.PID, self.PID)
	}
	rec.WrapperStart = self.Start + 1
	wantStranger(t, outside, grandchild.PID, grandchild.Start, "not in the run's")
}

func mustScan(t *testing.T) []proc.Stat {
	t.Helper()
	all, err := proc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func TestCgroupName(t *testing.T) {
	if got := membership.CgroupName("job.v1-2", 4242); got != "job.v1-2.4242" {
		t.Fatalf("CgroupName = %q", got)
	}
}

// Find names the run that holds a process by its session, or by a recorded
// escape; a process no run holds is ErrNotMember.
func TestFind(t *testing.T) {
	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	write := func(rec *statusfile.Record) {
		d, err := root.Create(rec.RunID)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		rec.CreatedAt = statusfile.Timestamp(time.Now())
		if err := statusfile.Write(d, rec, false); err != nil {
			t.Fatal(err)
		}
		if _, err := journal.Append(d, "created", nil, false); err != nil {
			t.Fatal(err)
		}
	}
	a := start(t, true, "sh", "-c", "sleep 600 & wait")
	aChild := childOf(t, a.PID)
	b := start(t, true, "sleep", "600")
	bEsc := start(t, true, "sleep", "600")
	stranger := start(t, true, "sleep", "600")
	ra := record(t, a)
	ra.RunID = "run-a"
	rb := record(t, b)
	rb.RunID = "run-b"
	rb.Escaped = []statusfile.Escaped{{PID: bEsc.PID, PGID: bEsc.PID, SID: bEsc.PID, Start: bEsc.Start}}
	write(ra)
	write(rb)

	for _, c := range []struct {
		p    proc.Stat
		want string
	}{{a, "run-a"}, {aChild, "run-a"}, {b, "run-b"}, {bEsc, "run-b"}} {
		f, err := membership.Find(root, c.p.PID, c.p.Start)
		if err != nil {
			t.Fatalf("Find(%d) = %v; want %s", c.p.PID, err, c.want)
		}
		if f.ID != c.want || f.Dir.ID != c.want || f.Record.RunID != c.want || f.Member.PID != c.p.PID || !f.Holds(f.Record, c.p.PID, c.p.Start) {
			t.Fatalf("Find(%d) = %q (dir %q, record %q), member %+v; want %s", c.p.PID, f.ID, f.Dir.ID, f.Record.RunID, f.Member, c.want)
		}
		wantLocked(t, root, c.want)
		f.Close()
	}
	if f, err := membership.Find(root, stranger.PID, stranger.Start); !errors.Is(err, membership.ErrNotMember) {
		t.Fatalf("Find(a stranger) = %+v, %v; want ErrNotMember", f, err)
	}
	if f, err := membership.Find(root, a.PID, a.Start+1); !errors.Is(err, membership.ErrNotMember) {
		t.Fatalf("Find(a PID with another start time) = %+v, %v; want ErrNotMember", f, err)
	}
	// Nothing is left locked by a lookup that found nothing, or by Close.
	for _, id := range []string{"run-a", "run-b"} {
		d, err := root.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		unlock, busy := d.RLock(0)
		if busy {
			t.Fatalf("run %s is still locked after Find and Close", id)
		}
		unlock()
		d.Close()
	}
}

// A run with a cgroup: every live process in it is the run's (the one that
// left the session by setsid too), CgroupMembers finds the same members as
// Members, and Find goes by the cgroup's name.
func TestCgroup(t *testing.T) {
	g := runtest.Cgroup(t, membership.CgroupName("run-c", os.Getpid()))
	leader := runtest.SpawnIn(t, g, "sleep", "600")
	esc := runtest.SpawnIn(t, g, "sleep", "600") // a session of its own, unrecorded: in the cgroup all the same
	rec := record(t, leader)
	rec.RunID, rec.WrapperPID, rec.Cgroup, rec.Boundary = "run-c", os.Getpid(), g.Path, membership.BoundaryCgroup
	r := membership.Run{Record: rec}
	wantMember(t, r, leader, false)
	wantMember(t, r, esc, true)

	full, _, err := r.Members()
	if err != nil {
		t.Fatal(err)
	}
	fast, ok := r.CgroupMembers()
	if !ok || len(fast) != 2 || len(full) != 2 || fast[0].PID != full[0].PID || fast[1].PID != full[1].PID {
		t.Fatalf("CgroupMembers = %v (%v), Members = %v; want the same two", pids(fast), ok, pids(full))
	}

	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	d, err := root.Create("run-c")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := statusfile.Write(d, rec, false); err != nil {
		t.Fatal(err)
	}
	f, err := membership.Find(root, esc.PID, esc.Start)
	if err != nil || f.ID != "run-c" {
		t.Fatalf("Find(an escape in the cgroup) = %+v, %v; want run-c", f, err)
	}
	wantLocked(t, root, "run-c")
	// A record other than the one Find judged by is judged anew.
	other := *f.Record
	other.WrapperPID = os.Getpid() + 1 // not the wrapper the cgroup's name gives
	if f.Holds(&other, esc.PID, esc.Start) {
		t.Fatalf("Holds(a record whose wrapper the cgroup does not name) = true")
	}
	f.Close()
}

// wantLocked checks that run id's lock is held (by a Found): a second
// opener cannot take it, even shared.
func wantLocked(t *testing.T, root *rundir.Root, id string) {
	t.Helper()
	d, err := root.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	unlock, busy := d.RLock(0)
	if !busy {
		unlock()
		t.Fatalf("run %s: Find handed it back unlocked", id)
	}
}

// Logs: a process whose stdout is the run's stdout.log (the file, not one
// of the same name) is found as the run's from outside, however it left
// the session; and the kernel's read lease says whether anyone still has
// a log open for writing: a reader does not count, a stopped writer does,
// a dead one does not.
func TestLogs(t *testing.T) {
	d := runtest.RunDir(t, "logs-1")
	for _, name := range []string{rundir.StdoutFile, rundir.StderrFile} {
		if err := d.WriteOnce(name, nil); err != nil {
			t.Fatal(err)
		}
	}
	logs := membership.LogsOf(d)
	if unheld, ok := logs.Unheld(); !ok || !unheld {
		t.Fatalf("Unheld with nobody holding the logs: %v, %v", unheld, ok)
	}
	spawn := func(path string, write bool) proc.Stat {
		flag := os.O_RDONLY
		if write {
			flag = os.O_WRONLY | os.O_APPEND | os.O_CREATE
		}
		f, err := os.OpenFile(path, flag, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command("sleep", "600")
		if write {
			cmd.Stdout = f
		} else {
			cmd.Stdin = f
		}
		cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
		return runtest.StartInGroup(t, cmd).Leader
	}
	reader := spawn(filepath.Join(d.Path, rundir.StdoutFile), false)
	if unheld, ok := logs.Unheld(); !ok || !unheld {
		t.Fatalf("Unheld with a reader only: %v, %v", unheld, ok)
	}
	namesake := spawn(filepath.Join(t.TempDir(), rundir.StdoutFile), true)
	writer := spawn(filepath.Join(d.Path, rundir.StdoutFile), true)
	if logs.Holds(reader.PID, 1) || logs.Holds(namesake.PID, 1) || !logs.Holds(writer.PID, 1) {
		t.Fatalf("Holds: reader %v, namesake %v, writer %v; want only the writer",
			logs.Holds(reader.PID, 1), logs.Holds(namesake.PID, 1), logs.Holds(writer.PID, 1))
	}
	if err := unix.Kill(writer.PID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if unheld, ok := logs.Unheld(); !ok || unheld {
		t.Fatalf("Unheld with a stopped writer: %v, %v; want held", unheld, ok)
	}
	boot, err := proc.BootID()
	if err != nil {
		t.Fatal(err)
	}
	all, err := proc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	rec := &statusfile.Record{RunID: "logs-1", BootID: boot}
	ms, _ := membership.Run{Record: rec, Logs: logs}.Judge(all)
	if len(ms) != 1 || ms[0].PID != writer.PID {
		t.Fatalf("members by the logs: %+v; want the writer %d alone", ms, writer.PID)
	}
	if err := unix.Kill(writer.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runtest.Eventually(t, "the writer to die", func() bool { return !proc.Alive(writer.PID, writer.Start) })
	if unheld, ok := logs.Unheld(); !ok || !unheld {
		t.Fatalf("Unheld once the writer died: %v, %v", unheld, ok)
	}
}
