package soak

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// A run root on a small tmpfs that fills up mid-run. Three runs are live
// when a filler file takes every free block: one is stopped by its lease,
// one by a TERM to its wrapper, one by the cancel command. Each must be
// stopped (its group empty), and its final record must land all the same
// (the journal's space is reserved at the claim, and a record that cannot
// be replaced is overwritten in place); no half-written file may be read as
// a record (every status.json present parses, no temp file
// is left, every journal verifies); and once space returns, reconcile must
// be truthful: nothing the host shows as dead is called running, nothing
// without a terminal record is called completed or cancelled.
func TestFullDisk(t *testing.T) {
	requireRoot(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	// Registered first, so it runs last: after every process is killed.
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	root := filepath.Join(mnt, "runs")
	tmp := t.TempDir() // not on the tmpfs: where the jobs say who they are

	type run struct {
		id    string
		lease string
		w     *runtest.Cmd
		r     runtest.Run
	}
	runs := []*run{{id: "full-lease", lease: "5"}, {id: "full-term", lease: "60"}, {id: "full-cancel", lease: "60"}}
	for _, x := range runs {
		// The job keeps writing to its stdout.log (the writes fail once
		// the disk is full) and has a group member.
		script := sayWho(filepath.Join(tmp, x.id+".pid")) + `; sleep 60 & while :; do echo tick || :; sleep 0.1; done`
		x.w = runtest.Start(t, root, "run", "--no-stream", "--lease", x.lease, "--grace", "1", x.id, "--", "sh", "-c", script)
		x.r = runtest.Run{Root: root, ID: x.id}
		t.Cleanup(x.r.Kill)
		t.Cleanup(func() { killGroup(readWho(filepath.Join(tmp, x.id+".pid"))) })
	}
	for _, x := range runs {
		x.r.WaitState(t, statusfile.Running)
	}

	// Fill the disk.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{'f'}, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	for i := 0; i < 64; i++ { // and the last partial blocks
		if _, err := f.Write(chunk[:64]); err != nil {
			break
		}
	}
	f.Close()
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt, &sfs); err != nil || sfs.Bavail != 0 {
		t.Fatalf("the tmpfs is not full: %d blocks free (%v)", sfs.Bavail, err)
	}

	// Stop two of them now; the third's lease runs out by itself.
	term, cancel := runs[1], runs[2]
	if err := term.w.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, out, errs := aw(t, nil, "--root", root, "cancel", "--wait", "20s", cancel.id)
	t.Logf("cancel on a full disk: exit %d\n%s%s", code, out, errs)
	// The job must be stopped, and cancel confirms it by the final record.
	cancelStopped := runtest.Within(runtest.Patience, func() bool {
		return len(group(readWho(filepath.Join(tmp, cancel.id+".pid")))) == 0
	})
	if !cancelStopped {
		knownBug(t, "cli/cmd_cancel.go: `cancel` on a full disk, wrapper alive: exit %d and the job not stopped; stderr: %s", code, errs)
		// Stop it the way that works, so the checks below cover it too.
		if err := cancel.w.Process.Signal(unix.SIGTERM); err != nil && !cancel.w.Exited() {
			t.Fatal(err)
		}
	}
	for _, x := range runs {
		leader := readWho(filepath.Join(tmp, x.id+".pid"))
		runtest.Eventually(t, x.id+"'s group to be stopped on a full disk", func() bool { return len(group(leader)) == 0 })
		c := x.w.Wait(t)
		want := 143
		if x.id == "full-lease" {
			want = 124
		}
		if c != want {
			t.Errorf("%s: wrapper exit %d, want %d", x.id, c, want)
		}
		// The records land although the disk is full: the intent and
		// final lines in the journal's reserved space, the record
		// overwritten in place.
		if rec := x.r.Status(); rec == nil || rec.State != statusfile.Cancelled || rec.Code() != want {
			t.Errorf("%s: the final record did not land on the full disk: %+v\nwrapper stderr:\n%s", x.id, rec, x.w.Stderr.String())
		}
	}

	// Nothing half-written is read as a record.
	checkNoTornFiles := func(when string) {
		for _, x := range runs {
			ents, err := os.ReadDir(x.r.Dir())
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".") {
					t.Errorf("%s: %s: temp file %s left behind", when, x.id, e.Name())
				}
			}
			if b, err := os.ReadFile(filepath.Join(x.r.Dir(), "status.json")); err == nil {
				if _, err := statusfile.Parse(b); err != nil {
					t.Errorf("%s: %s: status.json does not parse: %v", when, x.id, err)
				}
			}
			jf, err := os.Open(filepath.Join(x.r.Dir(), "events.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := journal.Verify(jf); err != nil {
				t.Errorf("%s: %s: journal: %v", when, x.id, err)
			}
			jf.Close()
		}
	}
	checkNoTornFiles("disk full")
	judge := func(when string) {
		vs := reconcileAll(t, root)
		for _, x := range runs {
			v, ok := vs[x.id]
			rec := x.r.Status()
			switch {
			case !ok:
				t.Errorf("%s: reconcile said nothing about %s", when, x.id)
			case v.Outcome == "running":
				t.Errorf("%s: %s: reconcile says running, but its wrapper and group are gone: %+v", when, x.id, v)
			case (v.Outcome == "completed" || v.Outcome == "cancelled") && (rec == nil || !statusfile.Terminal(rec.State)):
				t.Errorf("%s: %s: reconcile says %s without a terminal record: %+v", when, x.id, v.Outcome, v)
			}
			state := "none"
			if rec != nil {
				state = rec.State
			}
			t.Logf("%s: %s: record %s, reconcile %s: %s", when, x.id, state, v.Outcome, v.Reason)
		}
	}
	judge("disk full")

	// Space returns.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	judge("space back")
	checkNoTornFiles("space back")
}
