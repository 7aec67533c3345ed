package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/pgtest"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The PostgreSQL ledger shared by a fleet, through the binary and the
// test's sshd: a runner killed mid-run settled by another, exactly once;
// the database stopped mid-run.

// pgLedger starts a private PostgreSQL for one test, makes a database in
// it, and the ledger in that through the binary (`ledger init`). Every
// write to the ledger's rows is logged, by a trigger, in the table
// writes (n, run_id, state, settled_by): the database's own account of
// what was written, in order.
func pgLedger(t *testing.T) (*pgtest.Server, string, string) {
	t.Helper()
	pg := startPG(t)
	ctx := context.Background()
	db, err := pg.NewDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	url := pg.URL("postgres", db)
	if code, out := runBin("ledger", "init", "--ledger", url); code != 0 {
		t.Fatalf("ledger init: exit %d: %s", code, out)
	}
	if err := pg.Exec(ctx, db, `
CREATE TABLE writes (n bigserial PRIMARY KEY, run_id text, state text, settled_by text);
CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO writes (run_id, state, settled_by)
	VALUES (NEW.run_id, NEW.state, coalesce(NEW.record->'settled_by'->>'host', ''));
	RETURN NEW;
END $$;
CREATE TRIGGER log_write AFTER INSERT OR UPDATE OF state, record ON agent_wrap_runs
	FOR EACH ROW EXECUTE FUNCTION log_write();`); err != nil {
		t.Fatal(err)
	}
	return pg, db, url
}

// writesOf returns the states written to run id's row, in order, each with
// the settle's host when a settle wrote it ("settled@HOST").
func writesOf(t *testing.T, pg *pgtest.Server, db, id string) []string {
	t.Helper()
	rows, err := pg.Query(context.Background(), db, `SELECT state, settled_by FROM writes WHERE run_id = $1 ORDER BY n`, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		if r[1] != "" {
			r[0] += "@" + r[1]
		}
		out = append(out, r[0])
	}
	return out
}

// pgRec reads run id's record from the database ledger at url.
func pgRec(t *testing.T, url, id string) *ledger.Record {
	t.Helper()
	ctx := context.Background()
	l, err := ledger.Open(ctx, url, false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r, err := l.Read(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runBinEnv is runBin with env added to the test's environment.
func runBinEnv(env []string, args ...string) (int, string) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return exitCode(err), string(out)
}

// gateJob prints "started", waits for FILE, then exits code.
func gateJob(file string, code int) []string {
	return []string{"sh", "-c", `echo started; while [ ! -e "$1" ]; do sleep 0.1; done; exit "$2"`, "sh", file, strconv.Itoa(code)}
}

// Two "runner machines" on one database (two
// controller host names): runner A's controllers, one per run, are
// SIGKILLed by their PIDs mid-run, and one is SIGSTOPped instead. While
// A's heartbeats are fresh, runner B's `settle --all --dead` touches
// nothing. Once they are older than the runs' give-up time, two settles
// started at once settle every run exactly once (the database's own log of
// writes says so) with the host's outcome; a third has nothing to do. The
// stopped controller, continued, finds its run settled by B, says so,
// exits 255 and overwrites nothing.
func TestSSHPostgresFleetSettleOnce(t *testing.T) {
	t.Parallel()
	pg, db, url := pgLedger(t)
	c := newCtlHarness(t)
	c.ledger = url
	gate := filepath.Join(t.TempDir(), "go")
	c.env = []string{"XDG_STATE_HOME=" + t.TempDir()}
	runnerA := append([]string{"AGENT_WRAP_CONTROLLER_HOST=runner-a"}, c.env...)
	runnerB := append([]string{"AGENT_WRAP_CONTROLLER_HOST=runner-b"}, c.env...)
	const n = 4 // killed; one more is stopped
	flags := []string{"--lease", "120s", "--grace", "1s", "--give-up", "5s"}
	id := func(i int) string { return "fleet-" + strconv.Itoa(i) }
	var ks []*ctl
	for i := range n + 1 {
		ks = append(ks, startCtlEnv(t, runnerA, c.sshArgs(c.srv.Destination(), id(i), flags, gateJob(gate, 10+i)...)))
	}
	for i, k := range ks {
		k.waitOut(t, id(i)+" started", "started\n")
		c.waitRunning(id(i))
	}
	if code, out := runBinEnv(runnerB, "settle", "--all", "--dead", "--ledger", url); code != 0 || out != "" {
		t.Fatalf("settle --dead while runner A lives: exit %d, want 0 and nothing done:\n%s", code, out)
	}
	late := ks[n]
	late.signal(t, syscall.SIGSTOP)
	for _, k := range ks[:n] {
		k.signal(t, syscall.SIGKILL)
		k.wait(t)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range n + 1 {
		wantFinal(t, c.waitTerminal(id(i)), "finished", "", 10+i)
	}

	// Runner B sees A's runs as dead once their heartbeats are older than
	// the 5 s give-up time.
	runtest.Eventually(t, "runner A's runs dead to runner B", func() bool {
		code, out := runBinEnv(runnerB, "ledger", "--json", "--dead", "--controller", "runner-a", "--ledger", url)
		if code == 0 && strings.Count(out, "\n") == n+1 {
			return true
		}
		time.Sleep(200 * time.Millisecond) // poll interval: each poll is a process
		return false
	})
	type result struct {
		code int
		out  string
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			code, out := runBinEnv(runnerB, "settle", "--all", "--dead", "--ledger", url)
			results <- result{code, out}
		}()
	}
	r1, r2 := <-results, <-results
	t.Logf("two settles at once:\n%d: %s\n%d: %s", r1.code, r1.out, r2.code, r2.out)
	for _, r := range []result{r1, r2} {
		if r.code != 0 && r.code != 3 {
			t.Errorf("a settle exited %d, want 0 (settled) or 3 (the other was settling one)", r.code)
		}
	}
	both := r1.out + r2.out
	for i := range n + 1 {
		settled := fmt.Sprintf("%s: completed (exit %d)\n", id(i), 10+i)
		if got := strings.Count(both, settled); got != 1 {
			t.Errorf("%s settled by %d of the two settles, want exactly 1:\n%s", id(i), got, both)
		}
		if w := writesOf(t, pg, db, id(i)); strings.Join(w, " ") != "launching running settled@runner-b" {
			t.Errorf("%s: the database's writes %v, want launching, running, then one settle by runner-b", id(i), w)
		}
		r := pgRec(t, url, id(i))
		if r.State != ledger.Settled || r.Outcome != ledger.Completed || r.Code() != 10+i ||
			r.Controller == nil || r.Controller.Host != "runner-a" || r.SettledBy == nil || r.SettledBy.Host != "runner-b" {
			t.Errorf("%s: record %+v", id(i), r)
		}
	}
	if code, out := runBinEnv(runnerB, "settle", "--all", "--dead", "--ledger", url); code != 0 || out != "" {
		t.Errorf("a third settle: exit %d, want 0 and nothing to do:\n%s", code, out)
	}

	// The stopped owner comes back: its write of the outcome is refused.
	late.signal(t, syscall.SIGCONT)
	if code := late.wait(t); code != 255 || !strings.Contains(late.stderr(), "settled by someone else") ||
		!strings.Contains(late.stderr(), "runner-b") {
		t.Errorf("the late owner: exit %d, want 255 saying runner-b settled the run:\n%s", code, late.stderr())
	}
	if w := writesOf(t, pg, db, id(n)); strings.Join(w, " ") != "launching running settled@runner-b" {
		t.Errorf("the late owner's run: the database's writes %v, want its settle by runner-b last", w)
	}
}

// The database stopped (SIGQUIT to the postmaster by its
// PID, as `pg_ctl stop -m immediate`) while runs are live: the run goes on
// past its 10 s lease (its controller renews it); a new ssh launches
// nothing until its launching row commits; the controller says what it
// cannot write and keeps it. Another, whose --give-up (4 s) passes with a
// write not landed (its outcome, or a detach on a loaded machine), exits
// 255 naming its run, and stops renewing it. Once the database is back the
// writes land in order, the waiting run launches, and settle records the
// one given up on with its host's outcome.
func TestSSHPostgresAway(t *testing.T) {
	t.Parallel()
	pg, db, url := pgLedger(t)
	c := newCtlHarness(t)
	c.ledger = url
	c.env = []string{"XDG_STATE_HOME=" + t.TempDir()}
	gate := filepath.Join(t.TempDir(), "go")
	const lease = 10 * time.Second
	flags := []string{"--lease", "10s", "--renew-every", "1s", "--grace", "1s"}
	x := c.start("away-x", append(flags, "--give-up", "120s"), gateJob(gate, 4)...)
	z := c.start("away-z", append(flags, "--give-up", "4s"), gateJob(gate, 6)...)
	for _, id := range []string{"away-x", "away-z"} {
		c.waitRunning(id)
		runtest.Eventually(t, id+" running in the ledger", func() bool { return pgRec(t, url, id).State == ledger.Running })
	}

	if err := pg.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	y := c.start("away-y", []string{"--lease", "30s"}, "echo", "launched")
	runtest.Eventually(t, "the new run waiting for its launching row", func() bool {
		return strings.Contains(y.stderr(), "not launching until it commits")
	})
	// Past one lease since the stop, the live run still runs.
	for time.Since(stopped) < lease+time.Second {
		if r, err := c.status("away-x"); err != nil || r.State != "running" {
			t.Fatalf("away-x %v after the database stopped: %v (%v); the run should go on", time.Since(stopped), r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.status("away-y"); err == nil {
		t.Errorf("away-y was launched with no launching row")
	}

	// The jobs end while the database is away.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wantFinal(t, c.waitTerminal("away-x"), "finished", "", 4)
	zFinal := c.waitTerminal("away-z") // finished 6, or cancelled by its lease if z gave up before the gate
	if code := z.wait(t); code != 255 || !strings.Contains(z.stderr(), "run away-z: the ledger could not be written for 4s (--give-up)") {
		t.Errorf("away-z past its give-up: exit %d, want 255 naming the run:\n%s", code, z.stderr())
	}
	runtest.Eventually(t, "away-x saying it cannot write", func() bool {
		return strings.Contains(x.stderr(), "run away-x: cannot write to the ledger")
	})
	select {
	case <-x.group.Done():
		t.Fatalf("away-x ended with its outcome unwritten: %s", x.stderr())
	default:
	}

	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	if code := x.wait(t); code != 4 || !strings.Contains(x.stderr(), "the ledger is back") {
		t.Errorf("away-x after the database came back: exit %d, want 4:\n%s", code, x.stderr())
	}
	if w := writesOf(t, pg, db, "away-x"); len(w) < 3 || w[0] != "launching" || w[1] != "running" || w[len(w)-1] != "settled" ||
		strings.Count(strings.Join(w, " "), "settled") != 1 {
		t.Errorf("away-x: the database's writes %v, want launching, running ..., settled once, last", w)
	}
	if r := pgRec(t, url, "away-x"); r.State != ledger.Settled || r.Outcome != ledger.Completed || r.Code() != 4 {
		t.Errorf("away-x: record %+v", r)
	}
	if code := y.wait(t); code != 0 || y.stdout() != "launched\n" || !strings.Contains(y.stderr(), "took its launching record; launching") {
		t.Errorf("away-y once the database was back: exit %d, stdout %q:\n%s", code, y.stdout(), y.stderr())
	}
	if r := pgRec(t, url, "away-z"); r.State == ledger.Settled {
		t.Errorf("away-z: settled in the ledger, though its controller gave up before writing its end: %+v", r)
	}
	want := "away-z: completed (exit 6)"
	if zFinal.State == "cancelled" {
		want = "away-z: cancelled (exit 124), cause lease"
	}
	if code, out := runBinEnv(c.env, "settle", "away-z", "--ledger", url); code != 0 || !strings.Contains(out, want) {
		t.Errorf("settle away-z (the host says %v): exit %d, want %q: %s", zFinal, code, want, out)
	}
}

// A frozen owner is gone, on its own machine too. A controller SIGSTOPped
// mid-run keeps its PID alive on this machine; while its heartbeat is
// fresh, `settle --all --dead` here leaves its run alone. Once the
// heartbeat is older than the run's give-up time (8 s: heartbeats every
// third of it, so a loaded machine does not miss one), the same settle,
// on the same machine, takes the run and records the host's outcome, once.
// The owner, continued, finds the run settled, says so, exits 255 and
// overwrites nothing. On a files ledger and on PostgreSQL.
func TestFrozenOwnerOnThisMachineIsGone(t *testing.T) {
	eachLedger(t, func(t *testing.T, c *ctlHarness) {
		gate := filepath.Join(t.TempDir(), "go")
		id := "frozen-" + filepath.Base(t.Name())
		k := c.start(id, []string{"--lease", "120s", "--grace", "1s", "--give-up", "8s"}, gateJob(gate, 9)...)
		k.waitOut(t, id+" started", "started\n")
		c.waitRunning(id)
		if code, out := c.settle("--all", "--dead"); code != 0 || out != "" {
			t.Fatalf("settle --all --dead while the owner drives its run: exit %d, want 0 and nothing done:\n%s", code, out)
		}

		k.signal(t, syscall.SIGSTOP)
		stopped := time.Now()
		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		wantFinal(t, c.waitTerminal(id), "finished", "", 9)
		// The owner's process is alive (stopped, state T) all along.
		if st, err := proc.ReadStat(k.cmd.Process.Pid); err != nil || st.State != 'T' {
			t.Fatalf("the owner is not stopped: %v %+v", err, st)
		}

		var out string
		runtest.Eventually(t, "the frozen owner's run settled by settle --all --dead on its own machine", func() bool {
			var code int
			code, out = c.settle("--all", "--dead")
			if code == 0 && out != "" {
				return true
			}
			time.Sleep(200 * time.Millisecond) // poll interval: each poll is a process
			return false
		})
		if want := id + ": completed (exit 9)\n"; out != want {
			t.Errorf("settle --all --dead: %q, want %q", out, want)
		}
		r := c.ledgerRec(id)
		if r.State != ledger.Settled || r.Outcome != ledger.Completed || r.Code() != 9 || r.SettledBy == nil ||
			r.Controller == nil || r.SettledBy.Host != r.Controller.Host || r.SettledBy.PID == r.Controller.PID {
			t.Errorf("the record after the settle: %+v", r)
		}
		// Judged gone by its heartbeat, not by a stopwatch: the heartbeat
		// the settle saw was older than the give-up time when it settled.
		if age := r.SettledAt.Sub(r.HeartbeatAt); age <= 8*time.Second {
			t.Errorf("settled %v after the last heartbeat, want more than the 8 s give-up (stopped at %v)", age, stopped)
		}
		if code, out := c.settle("--all", "--dead"); code != 0 || out != "" {
			t.Errorf("a second settle: exit %d, want 0 and nothing to do:\n%s", code, out)
		}

		k.signal(t, syscall.SIGCONT)
		if code := k.wait(t); code != 255 || !strings.Contains(k.stderr(), "settled by someone else") {
			t.Errorf("the owner, continued: exit %d, want 255 saying someone else settled the run:\n%s", code, k.stderr())
		}
		if r2 := c.ledgerRec(id); r2.SettledBy == nil || *r2.SettledBy != *r.SettledBy || !r2.SettledAt.Equal(r.SettledAt) {
			t.Errorf("the owner overwrote the settle: before %+v, after %+v", r, r2)
		}
	})
}
