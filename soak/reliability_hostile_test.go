package soak

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// hostileCmds are the commands every hostile layout is tried with; %s is
// the run ID, and ELSEWHERE a directory outside the root.
var hostileCmds = [][]string{
	{"status", "%s"},
	{"show", "%s"},
	{"cancel", "--wait", "10s", "%s"},
	{"renew", "%s"},
	{"watchdog", "--once"},
	{"reconcile", "%s"},
	{"verify", "%s"},
	{"logs", "%s"},
	{"run", "%s", "--", "touch", "ELSEWHERE/ran"},
}

// Hostile layouts: a run directory, or one of its files, replaced by a
// symlink to one elsewhere; a run directory or file owned by another user;
// files or the directory writable by group or others. The run is a
// fabricated record naming a live session leader (a decoy `sleep`) with an
// expired lease, so any command that believed it would stop the decoy (the
// control case proves it does, untampered: cancel stops it and, as the run
// has neither a wrapper nor a cgroup, says cleanup cannot be confirmed). Every command must refuse with
// a clear error, follow nothing, write nothing (the root and the symlinks'
// targets keep their content and mtime), signal nothing (the decoy lives)
// and run nothing.
func TestHostileLayouts(t *testing.T) {
	requireRoot(t)
	top := t
	dpid, dstart := decoy(t)
	otherUID := testUser(t)

	type layout struct {
		name   string
		tamper func(t *testing.T, run, elsewhere string)
	}
	symlinkFile := func(name string) func(*testing.T, string, string) {
		return func(t *testing.T, run, elsewhere string) {
			target := filepath.Join(elsewhere, name)
			must(t, os.Rename(filepath.Join(run, name), target))
			must(t, os.Symlink(target, filepath.Join(run, name)))
		}
	}
	chownTo := func(name string) func(*testing.T, string, string) {
		return func(t *testing.T, run, elsewhere string) {
			if otherUID < 0 {
				t.Skip("no other user to own it (useradd failed)")
			}
			must(t, os.Lchown(filepath.Join(run, name), otherUID, otherUID))
		}
	}
	chmodTo := func(name string, mode os.FileMode) func(*testing.T, string, string) {
		return func(t *testing.T, run, elsewhere string) {
			must(t, os.Chmod(filepath.Join(run, name), mode))
		}
	}
	layouts := []layout{
		{"dir-symlink", func(t *testing.T, run, elsewhere string) {
			target := filepath.Join(elsewhere, "run")
			must(t, os.Rename(run, target))
			must(t, os.Symlink(target, run))
		}},
		{"dir-other-owner", chownTo(".")},
		{"dir-mode-0770", chmodTo(".", 0o770)},
		{"dir-mode-0707", chmodTo(".", 0o707)},
	}
	for _, f := range []string{"status.json", "events.jsonl", "lock", "pid", "pgid", "deadline_epoch", "stdout.log", "stderr.log"} {
		layouts = append(layouts, layout{"symlink-" + f, symlinkFile(f)})
	}
	for _, f := range []string{"status.json", "events.jsonl", "lock", "deadline_epoch", "stdout.log"} {
		layouts = append(layouts, layout{"other-owner-" + f, chownTo(f)})
		layouts = append(layouts, layout{"mode-0620-" + f, chmodTo(f, 0o620)})
		layouts = append(layouts, layout{"mode-0606-" + f, chmodTo(f, 0o606)})
	}

	// Control: untampered, the same fabricated run is acted on.
	t.Run("control", func(t *testing.T) {
		cpid, cstart := decoy(t)
		for _, args := range hostileCmds {
			root, elsewhere := filepath.Join(t.TempDir(), "runs"), t.TempDir()
			id := fabricate(t, root, cpid, cstart, args[0] == "watchdog")
			code, out, errs := aw(t, nil, hostileArgs(root, id, elsewhere, args)...)
			ok := code == 0
			switch args[0] {
			case "cancel":
				// The fabricated run has no wrapper and no cgroup: the
				// stop from outside sees only the session, so the honest
				// answer is cancelled with cleanup not confirmed (exit
				// 1), once the decoy is stopped (checked below).
				ok = code == 1 && strings.Contains(out, "cancelled") && strings.Contains(errs, "cleanup cannot be confirmed")
			case "reconcile":
				ok = code == 3 // running, supervisor lost
			case "watchdog":
				ok = strings.Contains(out, `"action":"stopped"`)
			case "run":
				ok = code == 75 // the ID is live: never run twice
			}
			if !ok {
				t.Errorf("%v on an untampered run: exit %d\n%s%s", args, code, out, errs)
			}
			if args[0] == "cancel" || args[0] == "watchdog" {
				if !runtest.Within(runtest.Patience, func() bool { return !proc.Alive(cpid, 0) }) {
					t.Errorf("%v did not stop the decoy: the control proves nothing", args)
				}
				cpid, cstart = decoy(t)
			}
		}
	})

	refusals, cases := 0, 0
	for li, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			for ci, args := range hostileCmds {
				// go test tries every other command on each layout, in
				// turn, so each command meets half the layouts; make soak
				// tries them all.
				if !soaking() && (li+ci)%2 != 0 {
					continue
				}
				cases++
				root, elsewhere := filepath.Join(t.TempDir(), "runs"), t.TempDir()
				id := fabricate(t, root, dpid, dstart, args[0] == "watchdog")
				l.tamper(t, filepath.Join(root, id), elsewhere)
				before := snapshot(t, root, elsewhere)
				failed := t.Failed()
				code, out, errs := aw(t, nil, hostileArgs(root, id, elsewhere, args)...)
				what := fmt.Sprintf("%s: %v", l.name, args[:1])
				refused := code != 0
				switch args[0] {
				case "watchdog":
					refused = strings.Contains(out, `"action":"skipped"`) || strings.Contains(out, `"action":"refused"`)
				case "reconcile":
					refused = code == 4 && strings.Contains(out, "unknown")
				}
				if !refused {
					t.Errorf("%s was not refused: exit %d\n%s%s", what, code, out, errs)
				}
				if !clearReason(out + errs) {
					t.Errorf("%s: no clear reason (symlink, owner or mode) given:\n%s%s", what, out, errs)
				}
				if after := snapshot(t, root, elsewhere); after != before {
					t.Errorf("%s changed files:\nbefore:\n%s\nafter:\n%s", what, before, after)
				}
				if _, err := os.Lstat(filepath.Join(elsewhere, "ran")); err == nil {
					t.Errorf("%s ran the command", what)
				}
				if !proc.Alive(dpid, dstart) {
					t.Errorf("%s signalled the decoy (pid %d)", what, dpid)
					dpid, dstart = decoy(top)
				}
				if !t.Failed() || failed {
					refusals++
				}
			}
		})
	}
	t.Logf("%d layouts x %d commands, %d cases tried: %d refused with a clear reason, nothing followed, written, run or signalled", len(layouts), len(hostileCmds), cases, refusals)
}

func hostileArgs(root, id, elsewhere string, args []string) []string {
	out := []string{"--root", root}
	for _, a := range args {
		a = strings.ReplaceAll(a, "%s", id)
		out = append(out, strings.ReplaceAll(a, "ELSEWHERE", elsewhere))
	}
	return out
}

func clearReason(s string) bool {
	for _, w := range []string{"symlink", "owned by uid", "writable by group or others"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fabricate writes a run that names pid (a session leader that started at
// start) as its live job, with a dead wrapper: the deadline is expired when
// expired is set (for the watchdog), else 5 minutes away (so renew would
// succeed). Every file a run has is present; all mtimes are set to 2020.
func fabricate(t *testing.T, rootPath string, pid int, start uint64, expired bool) string {
	t.Helper()
	const id = "hostile-1"
	root, err := rundir.OpenRoot(rootPath, true)
	must(t, err)
	defer root.Close()
	d, err := root.Create(id)
	must(t, err)
	defer d.Close()
	boot, err := proc.BootID()
	must(t, err)
	now := statusfile.Timestamp(time.Now())
	rec := &statusfile.Record{RunID: id, State: statusfile.Running, PID: pid, PGID: pid, SID: pid, LeaderStart: start,
		BootID: boot, Command: []string{"sleep", "600"}, CreatedAt: now, StartedAt: now, LeaseSeconds: 300, GraceSeconds: 1, Boundary: "session+subreaper"}
	must(t, statusfile.Write(d, rec, true))
	_, err = journal.Append(d, "created", journal.Fields{"wrapper_pid": 0}, false)
	must(t, err)
	_, err = journal.Append(d, "started", journal.Fields{"pid": pid, "pgid": pid, "sid": pid, "leader_start": start}, true)
	must(t, err)
	line := []byte(strconv.Itoa(pid) + "\n")
	must(t, d.WriteOnce(rundir.PIDFile, line))
	must(t, d.WriteOnce(rundir.PGIDFile, line))
	must(t, d.WriteOnce(rundir.StdoutFile, []byte("job output\n")))
	must(t, d.WriteOnce(rundir.StderrFile, nil))
	dl := time.Now().Add(5 * time.Minute).Unix()
	if expired {
		dl = time.Now().Add(-time.Minute).Unix()
	}
	must(t, lease.WriteDeadline(d, dl))
	// A run of this version locks its directory and has no lock file; an
	// older agent-wrap left an empty `lock`, which every command still
	// takes (and checks), so the fabricated run has one.
	must(t, d.WriteOnce(rundir.LockFile, nil))
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	ents, err := os.ReadDir(d.Path)
	must(t, err)
	for _, e := range ents {
		must(t, os.Chtimes(filepath.Join(d.Path, e.Name()), old, old))
	}
	return id
}

// snapshot describes every entry below the dirs without following a
// symlink: type, mode, owner, size, mtime, link target and content.
func snapshot(t *testing.T, dirs ...string) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".watchdog") {
				return nil // the watchdog's own lock in the root
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "%s %v", p, fi.Mode())
			if st, ok := sysStat(fi); ok {
				fmt.Fprintf(&b, " uid=%d", st)
			}
			if !fi.IsDir() {
				fmt.Fprintf(&b, " size=%d mtime=%s", fi.Size(), fi.ModTime().UTC().Format(time.RFC3339Nano))
			}
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				fmt.Fprintf(&b, " -> %s", l)
			case fi.Mode().IsRegular():
				c, _ := os.ReadFile(p)
				fmt.Fprintf(&b, " %q", bytes.TrimSpace(c))
			}
			b.WriteByte('\n')
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// testUser adds a system user for the test (removed at cleanup) and
// returns its uid, or -1 if it cannot.
func testUser(t *testing.T) int {
	t.Helper()
	name := fmt.Sprintf("awsoak%d", os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Logf("useradd %s: %v: %s", name, err, out)
		return -1
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Logf("userdel %s: %v: %s", name, err, out)
		}
	})
	out, err := exec.Command("id", "-u", name).Output()
	if err != nil {
		t.Logf("id -u %s: %v", name, err)
		return -1
	}
	uid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return -1
	}
	return uid
}
