//go:build linux

package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/timeline"
)

// show on a completed run, a cancelled one with an escape, a
// lease-expired one (ended on demand with renew --lease) and a lost one,
// checked against the journal line by line: every line is in the timeline
// once, in order, a summarized line only with lines of its own kind, and
// the human form has the line of every item, with its SEQ, its actor and
// its words.
func TestShowAgainstJournal(t *testing.T) {
	t.Parallel()
	root := runtest.NewRoot(t)

	if code, _, errOut := runtest.Exec(t, root, "run", "done", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("run done: exit %d: %s", code, errOut)
	}

	// cancelled, with a descendant that left the group
	c1, r1 := startRun(t, root, "esc", "--grace", "1s", "esc", "--", "sh", "-c", "setsid sleep 300 & wait")
	cleanupRun(t, r1)
	r1.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "the escape to be journaled", func() bool {
		for _, ev := range r1.Events(t) {
			if ev == "escaped" {
				return true
			}
		}
		return false
	})
	if code, out, errOut := runtest.Exec(t, root, "cancel", "esc"); code != 0 {
		t.Fatalf("cancel esc: exit %d\n%s%s", code, out, errOut)
	}
	c1.Wait(t)

	// the lease passed: renewed three times, then ended on demand
	c2, r2 := startRun(t, root, "lease", "--grace", "1s", "lease", "--", "sleep", "300")
	cleanupRun(t, r2)
	r2.WaitState(t, statusfile.Running)
	for i := 0; i < 3; i++ {
		if code, _, errOut := runtest.Exec(t, root, "renew", "lease"); code != 0 {
			t.Fatalf("renew: exit %d: %s", code, errOut)
		}
	}
	if code, _, errOut := runtest.Exec(t, root, "renew", "--lease", "1s", "lease"); code != 0 {
		t.Fatalf("renew --lease 1s: exit %d: %s", code, errOut)
	}
	if code := c2.Wait(t); code != 124 {
		t.Fatalf("lease run: exit %d, want 124", code)
	}

	// lost: the wrapper SIGKILLed, the job alive
	c3, r3 := startRun(t, root, "lost", "lost", "--", "sleep", "300")
	cleanupRun(t, r3)
	rec3 := r3.WaitState(t, statusfile.Running)
	killWrapper(t, c3, rec3)
	t.Cleanup(func() { runtest.KillGroup(rec3.PGID, rec3.LeaderStart) })

	// lost, then stopped by the watchdog once its lease (cut to 1s) passed
	c4, r4 := startRun(t, root, "wd", "--grace", "1s", "wd", "--", "sleep", "300")
	cleanupRun(t, r4)
	rec4 := r4.WaitState(t, statusfile.Running)
	killWrapper(t, c4, rec4)
	if code, _, errOut := runtest.Exec(t, root, "renew", "--lease", "1s", "wd"); code != 0 {
		t.Fatalf("renew --lease 1s wd: exit %d: %s", code, errOut)
	}
	runtest.Eventually(t, "the watchdog to stop wd", func() bool {
		runtest.Exec(t, root, "watchdog", "--once")
		rec := r4.Status()
		return rec != nil && statusfile.Terminal(rec.State)
	})

	for _, tc := range []struct {
		id   string
		runs []runtest.Run
		want []string // lines the human form must have
	}{
		{"done", nil, []string{
			`^run done: finished, exit 3; reconcile: completed$`,
			`^ +1 +0 +wrapper created: lease 5m, grace 5s`,
			`^ +3 +\d+ +wrapper leader \d+ exited 3$`,
			`^ +4 +\d+ +wrapper final: finished, exit 3, nothing survived$`,
		}},
		{"esc", nil, []string{
			`^run esc: cancelled \(cancel\), exit 143; reconcile: cancelled$`,
			`wrapper escaped: pid \d+ \(pgid \d+, sid \d+\): sleep 300$`,
			`cancel INTENT cancel requested: cause cancel$`,
			`wrapper signal TERM to group\+escaped\S* pgid \d+: pids [\d ]+, escaped \d+$`,
			`wrapper final: cancelled \(cancel\), exit 143, .*nothing survived$`,
		}},
		{"lease", nil, []string{
			`^run lease: cancelled \(lease\), exit 124; reconcile: cancelled$`,
			`^ +3-6 +\d+-\d+ +renew lease renewed 4 times, deadline .* \(lease 1s\)$`,
			`wrapper INTENT deadline expired: cause lease$`,
		}},
		{"wd", nil, []string{
			`^run wd: cancelled \(lease\), exit 124; reconcile: cancelled$`,
			` watchdog INTENT deadline expired: cause lease$`,
			` watchdog signal TERM to `,
			` watchdog final: cancelled \(lease\), exit 124`,
		}},
		{"lost", nil, []string{
			`^run lost: lost; reconcile: running \(supervisor lost\)$`,
			`^  record: running `,
		}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			r := runtest.Run{Root: root, ID: tc.id}
			entries := r.Journal(t)
			code, out, errOut := runtest.Exec(t, root, "show", "--json", tc.id)
			if code != 0 {
				t.Fatalf("show --json: exit %d: %s", code, errOut)
			}
			var s timeline.Show
			if err := json.Unmarshal([]byte(out), &s); err != nil {
				t.Fatalf("show --json: %v\n%s", err, out)
			}
			checkCovers(t, entries, s.Events)
			if !s.Verify.Intact || s.Verify.Lines != len(entries) {
				t.Errorf("verify: %+v, want intact, %d lines", s.Verify, len(entries))
			}
			code, out, errOut = runtest.Exec(t, root, "show", tc.id)
			if code != 0 {
				t.Fatalf("show: exit %d: %s", code, errOut)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if want := fmt.Sprintf("journal: intact, %d lines, hash chain verified", len(entries)); lines[len(lines)-1] != want {
				t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
			}
			if strings.Contains(out, "\x1b[") {
				t.Errorf("colour in output that is not a terminal:\n%s", out)
			}
			for _, it := range s.Events {
				seq := fmt.Sprint(it.Seq)
				if it.Count > 1 {
					seq += "-" + fmt.Sprint(it.LastSeq)
				}
				re := regexp.MustCompile(`(?m)^  +` + seq + ` +[\d-]+ +` + regexp.QuoteMeta(it.Actor) + ` ` + regexp.QuoteMeta(it.Text) + `$`)
				if !re.MatchString(out) {
					t.Errorf("no line for item %s (%s by %s: %q):\n%s", seq, it.Event, it.Actor, it.Text, out)
				}
			}
			for _, w := range tc.want {
				if !regexp.MustCompile(`(?m)` + w).MatchString(out) {
					t.Errorf("show lacks a line matching %s:\n%s", w, out)
				}
			}
		})
	}
}

// checkCovers asserts that items cover the journal's lines once each, in
// order: a single item is its line (event, actor from "by" where there is
// one, fields as journaled), a summary is a run of lines of one event.
func checkCovers(t *testing.T, entries []journal.Entry, items []timeline.Item) {
	t.Helper()
	seen := map[int64]bool{}
	last := int64(0)
	for _, it := range items {
		if it.Seq <= last {
			t.Errorf("item %d after %d: out of order", it.Seq, last)
		}
		last = it.Seq
		end := it.Seq
		if it.Count > 1 {
			end = it.LastSeq
		}
		n := 0
		for seq := it.Seq; seq <= end; seq++ {
			e := entries[seq-1]
			if e.Event != it.Event {
				if it.Count == 1 || e.Event == "lease_renewed" || e.Event == "action" {
					t.Errorf("item %d (%s) holds line %d, a %s", it.Seq, it.Event, seq, e.Event)
				}
				continue // another kind's line inside a summary's range: its own item
			}
			if seen[seq] {
				t.Errorf("line %d in two items", seq)
			}
			seen[seq] = true
			n++
		}
		if n != it.Count {
			t.Errorf("item %d counts %d lines, holds %d", it.Seq, it.Count, n)
		}
		if it.Count == 1 {
			e := entries[it.Seq-1]
			if by, ok := e.Fields["by"].(string); ok && by != it.Actor {
				t.Errorf("line %d by %q drawn as by %q", it.Seq, by, it.Actor)
			}
			if len(it.Fields) != len(e.Fields) {
				t.Errorf("line %d: fields %v, journaled %v", it.Seq, it.Fields, e.Fields)
			}
		}
	}
	for _, e := range entries {
		if !seen[e.Seq] {
			t.Errorf("journal line %d (%s) is in no item", e.Seq, e.Event)
		}
	}
}

// A broken chain is said, never hidden: the verdict names the first bad
// line, the lines that may have been changed are marked (from the line
// before, since a line's edit shows as the next one's prev), and show
// exits 1.
func TestShowBrokenChain(t *testing.T) {
	t.Parallel()
	root := runtest.NewRoot(t)
	if code, _, errOut := runtest.Exec(t, root, "run", "b1", "--", "sh", "-c", "exit 0"); code != 0 {
		t.Fatalf("run: exit %d: %s", code, errOut)
	}
	r := runtest.Run{Root: root, ID: "b1"}
	path := r.Dir() + "/events.jsonl"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// An edit of line 3 (the leader's exit code) breaks the chain at line 4.
	lines := strings.Split(string(b), "\n")
	lines[2] = strings.Replace(lines[2], `"exit_code":0`, `"exit_code":1`, 1)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runtest.Exec(t, root, "show", "b1")
	if code != 1 {
		t.Fatalf("show: exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, re := range []string{
		`(?m)^journal: BROKEN at line 4: prev does not match .*; lines from 3 on \(marked !\) are not trusted$`,
		`(?m)^ +! +4 +\d+ +wrapper final: `,
		`(?m)^ +! +3 +\d+ +wrapper leader \d+ exited 1$`,
		`(?m)^ +2 +\d+ +wrapper started: `,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("show lacks %s:\n%s", re, out)
		}
	}
	if !strings.Contains(errOut, "broken at line 4") || !strings.Contains(errOut, "hint:") {
		t.Errorf("stderr lacks the break and a hint:\n%s", errOut)
	}
}

// openPTY opens a pseudo-terminal pair: the master to read, the slave to
// give a process as its stdout.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// Colour only on a terminal (a real pseudo-terminal here), and never with
// NO_COLOR set.
func TestShowColourOnTerminal(t *testing.T) {
	t.Parallel()
	root := runtest.NewRoot(t)
	if code, _, errOut := runtest.Exec(t, root, "run", "--lease", "1s", "--grace", "1s", "c1", "--", "sleep", "30"); code != 124 {
		t.Fatalf("run: exit %d: %s", code, errOut)
	}
	for _, tc := range []struct {
		noColor string
		colour  bool
	}{{"", true}, {"1", false}} {
		m, s := openPTY(t)
		cmd := exec.Command(runtest.Binary(t), "--root", root, "show", "c1")
		cmd.Env = append(os.Environ(), "NO_COLOR="+tc.noColor, "TERM=xterm")
		cmd.Stdout = s
		if err := cmd.Run(); err != nil {
			t.Fatalf("show on a terminal: %v", err)
		}
		s.Close()
		var out bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := m.Read(buf)
			out.Write(buf[:n])
			if err != nil { // EIO once the slave is closed and drained
				break
			}
		}
		got := out.String()
		if !strings.Contains(got, "INTENT deadline expired") {
			t.Fatalf("NO_COLOR=%q: no timeline read from the terminal:\n%q", tc.noColor, got)
		}
		if has := strings.Contains(got, "\x1b[1;31mINTENT deadline expired"); has != tc.colour {
			t.Errorf("NO_COLOR=%q: coloured intent %v, want %v:\n%q", tc.noColor, has, tc.colour, got)
		}
		if !tc.colour && strings.Contains(got, "\x1b[") {
			t.Errorf("NO_COLOR=%q: escape codes on the terminal:\n%q", tc.noColor, got)
		}
	}
}
