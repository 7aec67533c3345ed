package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// A host that never answers (a real port nothing listens on): the
// controller says until when it retries and how to stop it, and at
// --give-up, since no attempt got as far as the login, it settles the run
// not_started itself, so `settle --all` has nothing left to trip on. On a
// files ledger and on PostgreSQL.
func TestUnreachableLaunchSaysUntilWhenAndSettles(t *testing.T) {
	eachLedger(t, func(t *testing.T, c *ctlHarness) {
		port := closedPort(t)
		id := "unreach-" + strings.ReplaceAll(t.Name()[strings.LastIndex(t.Name(), "/")+1:], "/", "-")
		start := time.Now()
		k := startCtlEnv(t, c.env, []string{"ssh", "--rsh", "ssh -p " + strconv.Itoa(port) + " -o BatchMode=yes",
			"--ledger", c.ledger, "--id", id, "--give-up", "3s", "127.0.0.1", "--", "true"})
		code := k.wait(t)
		stderr := k.stderr()
		m := regexp.MustCompile(`run ` + id + `: cannot reach 127\.0\.0\.1 \(ssh: connect to host 127\.0\.0\.1 port ` + strconv.Itoa(port) +
			`: Connection refused\); retrying until (\d\d:\d\d:\d\d) \S+ \(--give-up 3s\); to stop now: Ctrl-C, or kill -INT ` +
			strconv.Itoa(k.cmd.Process.Pid) + `\n`).FindStringSubmatch(stderr)
		if code != 255 || m == nil || strings.Count(stderr, "retrying") != 1 ||
			!strings.Contains(stderr, "not started: 127.0.0.1 could not be reached for 3s (--give-up); no attempt got as far as the login") {
			t.Fatalf("controller to a closed port: exit %d, want 255 saying until when it retries, how to stop it, and not started:\n%s", code, stderr)
		}
		// The time said is the give-up time: 3 s after the start, on this
		// machine's clock (a bound from recorded times, whole seconds).
		until, err := time.ParseInLocation("15:04:05", m[1], time.Local)
		if err != nil {
			t.Fatal(err)
		}
		y, mo, d := start.Local().Date()
		until = time.Date(y, mo, d, until.Hour(), until.Minute(), until.Second(), 0, time.Local)
		if lo, hi := start.Add(3*time.Second).Truncate(time.Second), time.Now().Add(3*time.Second); until.Before(lo) || until.After(hi) {
			t.Errorf("retrying until %s, want between %s and %s (the start plus --give-up)", m[1], lo.Format("15:04:05"), hi.Format("15:04:05"))
		}
		r := c.ledgerRec(id)
		if r.State != ledger.Settled || r.Outcome != ledger.NotStarted || !strings.Contains(r.Reason, "the command was never sent") {
			t.Errorf("the ledger after the give-up: %+v", r)
		}
		if code, out := c.settle("--all"); code != 0 || out != "" {
			t.Errorf("settle --all after the give-up: exit %d, want 0 and nothing to do:\n%s", code, out)
		}
	})
}

// `ledger forget RUN_ID` retires a launching run whose controller is gone
// only when its host, asked over the run's own rsh (the test's real sshd),
// says it never had it. It refuses one whose host cannot be asked (a real
// closed port: the launch may have reached it), one past launching, and one
// whose controller still drives it, changing nothing. On a files ledger and
// on PostgreSQL.
func TestLedgerForget(t *testing.T) {
	eachLedger(t, func(t *testing.T, c *ctlHarness) {
		ctx := context.Background()
		l, err := ledger.Open(ctx, c.ledger, true)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		rsh, err := controller.SplitCommand(c.rsh())
		if err != nil {
			t.Fatal(err)
		}
		// A controller gone: the PID of a process that has ended.
		gone := exec.Command("true")
		if err := gone.Run(); err != nil {
			t.Fatal(err)
		}
		mk := func(id, state string, rsh []string, pid int) {
			t.Helper()
			r := &ledger.Record{RunID: id, Dest: c.srv.Destination(), State: state, Rsh: rsh, RemoteBin: bin, RemoteRoot: c.root,
				Command: []string{"true"}, Lease: 60, Grace: 1, CreatedAt: time.Now().UTC(), ControllerPID: pid}
			if err := l.Create(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		sfx := t.Name()[strings.LastIndex(t.Name(), "/")+1:]
		never, unreach, running, live := "f-never-"+sfx, "f-unreach-"+sfx, "f-running-"+sfx, "f-live-"+sfx
		mk(never, ledger.Launching, rsh, gone.Process.Pid)
		mk(unreach, ledger.Launching, []string{"ssh", "-p", strconv.Itoa(closedPort(t)), "-o", "BatchMode=yes"}, gone.Process.Pid)
		mk(running, ledger.Running, rsh, gone.Process.Pid)
		mk(live, ledger.Launching, rsh, os.Getpid())

		forget := func(id string) (int, string) {
			cmd := exec.Command(bin, "ledger", "forget", "--ledger", c.ledger, id)
			cmd.Env = append(os.Environ(), c.env...)
			out, err := cmd.CombinedOutput()
			return exitCode(err), string(out)
		}
		if code, out := forget(never); code != 0 || !strings.Contains(out, never+": forgotten: not_started") {
			t.Errorf("forget a run its host never had: exit %d, want 0 and forgotten:\n%s", code, out)
		}
		if r := c.ledgerRec(never); r.State != ledger.Settled || r.Outcome != ledger.NotStarted || r.SettledBy == nil {
			t.Errorf("%s after forget: %+v", never, r)
		}
		for _, tc := range []struct {
			id   string
			code int
			says string
		}{
			{unreach, 255, "not forgotten: its launch may have reached " + c.srv.Destination()},
			{running, 1, "the run is running: it was seen on " + c.srv.Destination() + ", so it is not forgotten"},
			{live, 3, "not forgotten: its controller (pid " + fmt.Sprint(os.Getpid()) + ") is still driving it"},
		} {
			before := c.ledgerRec(tc.id)
			code, out := forget(tc.id)
			if code != tc.code || !strings.Contains(out, tc.says) {
				t.Errorf("forget %s: exit %d, want %d saying %q:\n%s", tc.id, code, tc.code, tc.says, out)
			}
			if after := c.ledgerRec(tc.id); after.State != before.State || !after.UpdatedAt.Equal(before.UpdatedAt) {
				t.Errorf("forget %s changed the record: %+v -> %+v", tc.id, before, after)
			}
		}
		// Forgetting again, or a run settled already, changes nothing.
		if code, out := forget(never); code != 0 || !strings.Contains(out, "settled already (not_started); nothing to forget") {
			t.Errorf("forget a forgotten run: exit %d:\n%s", code, out)
		}
		if code, out := forget("nosuch"); code != 66 || !strings.Contains(out, "no such run in the ledger") {
			t.Errorf("forget a run the ledger does not hold: exit %d, want 66:\n%s", code, out)
		}
	})
}
