package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/pgtest"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// startPG starts a private PostgreSQL for one test, stopped by its PID at
// the test's end (pass or fail).
func startPG(t *testing.T) *pgtest.Server {
	t.Helper()
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatalf("the PostgreSQL ledger's tests need a real server: %v", err)
	}
	t.Cleanup(pg.Stop)
	return pg
}

// The e2e binary's shared PostgreSQL, started by the first test that
// needs it and stopped by testMain.
var shared struct {
	once sync.Once
	pg   *pgtest.Server
	err  error
}

func stopSharedPG() {
	if shared.pg != nil {
		shared.pg.Stop()
	}
}

// newPGCtlHarness is newCtlHarness with a database ledger: a fresh
// database, initialised, on the shared server; ssh's -E logs go to a
// state directory of the test's own.
func newPGCtlHarness(t *testing.T) *ctlHarness {
	t.Helper()
	shared.once.Do(func() { shared.pg, shared.err = pgtest.Start() })
	if shared.err != nil {
		t.Fatalf("the PostgreSQL ledger's tests need a real server: %v", shared.err)
	}
	ctx := context.Background()
	db, err := shared.pg.NewDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	url := shared.pg.URL("postgres", db)
	p, err := ledger.OpenPostgresForInit(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.Init(ctx); err != nil {
		t.Fatal(err)
	}
	c := newCtlHarness(t)
	c.ledger = url
	c.env = []string{"XDG_STATE_HOME=" + t.TempDir()}
	return c
}

// sshLogDir is where the controller keeps ssh's -E logs: beside the
// records of a files ledger; the state directory with a database.
func (c *ctlHarness) sshLogDir() string {
	if !ledger.IsURL(c.ledger) {
		return c.ledger
	}
	for _, kv := range c.env {
		if v, ok := strings.CutPrefix(kv, "XDG_STATE_HOME="); ok {
			return filepath.Join(v, "agent-wrap", "ssh-logs")
		}
	}
	c.t.Fatal("a database ledger's harness without XDG_STATE_HOME")
	return ""
}

// eachLedger runs f on a files ledger and on a PostgreSQL one, in
// parallel.
func eachLedger(t *testing.T, f func(t *testing.T, c *ctlHarness)) {
	t.Parallel()
	t.Run("files", func(t *testing.T) {
		t.Parallel()
		f(t, newCtlHarness(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, newPGCtlHarness(t))
	})
}

func runBin(args ...string) (int, string) {
	out, err := exec.Command(bin, args...).CombinedOutput()
	return exitCode(err), string(out)
}

// The ledger's life on PostgreSQL through the binary:
// a bad URL, a wrong password, an empty database and a newer schema, each
// its message and code with nothing written; then `ledger init`, and a run
// through `agent-wrap ssh` recorded in the database as in the files.
func TestSSHPostgresLedger(t *testing.T) {
	t.Parallel()
	pg := startPG(t)
	ctx := context.Background()
	db, err := pg.NewDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, db, `CREATE ROLE runner LOGIN PASSWORD 'sekrit-pw'`); err != nil {
		t.Fatal(err)
	}
	url := pg.URL("postgres", db)
	c := newCtlHarness(t)
	c.ledger = url
	c.env = []string{"XDG_STATE_HOME=" + t.TempDir()}

	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"bad URL", []string{"ledger", "--ledger", "postgres://u:sekrit-pw@h:notaport/x"}, 64, "bad ledger URL"},
		{"wrong password", []string{"ledger", "--ledger", pg.TCPURL("runner", "sekrit-pw-wrong", db)}, 77, "refused access"},
		{"uninitialised", []string{"ledger", "--ledger", url}, 78, "ledger init"},
		{"uninitialised settle", []string{"settle", "--all", "--ledger", url}, 78, "ledger init"},
	} {
		code, out := runBin(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.says) || strings.Contains(out, "sekrit-pw") {
			t.Errorf("%s: exit %d, want %d saying %q, no password:\n%s", tc.name, code, tc.code, tc.says, out)
		}
	}
	// A database that does not exist: said so, with the createdb command
	// that makes it (not the circular "run ledger init"); that command,
	// run as given, makes it, and ledger init then succeeds.
	nodb := pg.URL("postgres", db+"_missing")
	for _, args := range [][]string{{"ledger", "init", "--ledger", nodb}, {"ledger", "--ledger", nodb},
		{"ssh", "--ledger", nodb, "--id", "nodb-run", "host.invalid", "--", "true"}} {
		code, out := runBin(args...)
		if code != 78 || !strings.Contains(out, `no database "`+db+`_missing"`) || !strings.Contains(out, "hint: create the database first") ||
			strings.Contains(out, "run 'agent-wrap ledger init' with this --ledger once") {
			t.Errorf("%v on a missing database: exit %d, want 78 naming it and createdb:\n%s", args, code, out)
		}
	}
	_, out := runBin("ledger", "init", "--ledger", nodb)
	m := regexp.MustCompile(`hint: create the database first, [^:]*: (createdb [^\n]*)\n`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no createdb command in:\n%s", out)
	}
	cmd := exec.Command("sh", "-c", m[1])
	cmd.Env = append(os.Environ(), "PATH="+pg.BinDir+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the hinted %s: %v\n%s", m[1], err, out)
	}
	if code, out := runBin("ledger", "init", "--ledger", nodb); code != 0 || !strings.Contains(out, "created") {
		t.Errorf("ledger init after the hinted createdb: exit %d: %s", code, out)
	}

	// ssh into an empty database: 78, nothing launched, no table made.
	k := c.start("pgnoschema", nil, "true")
	if code := k.wait(t); code != 78 || !strings.Contains(k.stderr(), "ledger init") {
		t.Errorf("ssh with an empty database: exit %d, want 78 naming ledger init:\n%s", code, k.stderr())
	}
	if _, err := c.status("pgnoschema"); err == nil {
		t.Errorf("the run was launched on the host without a launching record")
	}

	if code, out := runBin("ledger", "init", "--ledger", url); code != 0 || !strings.Contains(out, "created") {
		t.Fatalf("ledger init: exit %d: %s", code, out)
	}
	if code, out := runBin("ledger", "init", "--ledger", url); code != 0 || !strings.Contains(out, "nothing changed") {
		t.Errorf("second ledger init: exit %d: %s", code, out)
	}

	// A run through ssh, recorded in the database.
	k = c.start("pgrun", nil, "sh", "-c", "echo out; exit 7")
	if code := k.wait(t); code != 7 || k.stdout() != "out\n" {
		t.Fatalf("ssh with a PostgreSQL ledger: exit %d, stdout %q, stderr %s", code, k.stdout(), k.stderr())
	}
	code, out := runBin("ledger", "--json", "--ledger", url)
	var r ledger.Record
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
		t.Fatalf("ledger --json: exit %d: %s", code, out)
	}
	if r.RunID != "pgrun" || r.State != ledger.Settled || r.Outcome != ledger.Completed || r.Code() != 7 ||
		r.Controller == nil || r.Controller.PID == 0 || r.HeartbeatAt.IsZero() {
		t.Errorf("the run's record in the database: %+v", r)
	}
	// A duplicate ID: 64, the first record unchanged.
	k = c.start("pgrun", nil, "true")
	if code := k.wait(t); code != 64 {
		t.Errorf("duplicate run ID: exit %d, want 64: %s", code, k.stderr())
	}

	// A newer schema: refused, nothing written.
	if err := pg.Exec(ctx, db, `UPDATE agent_wrap_schema SET version = 99`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ledger", "--ledger", url}, {"ledger", "init", "--ledger", url}} {
		if code, out := runBin(args...); code != 78 || !strings.Contains(out, "99") {
			t.Errorf("%v over a newer schema: exit %d, want 78 naming its version: %s", args, code, out)
		}
	}
	k = c.start("pgnewer", nil, "true")
	if code := k.wait(t); code != 78 {
		t.Errorf("ssh over a newer schema: exit %d, want 78: %s", code, k.stderr())
	}
	if _, err := c.status("pgnewer"); err == nil {
		t.Errorf("a run was launched over a newer schema")
	}
}

// ledgerState is run id's state in the ledger, "" while it holds no record.
func (c *ctlHarness) ledgerState(id string) string {
	ctx := context.Background()
	l, err := ledger.Open(ctx, c.ledger, false)
	if err != nil {
		return ""
	}
	defer l.Close()
	r, err := l.Read(ctx, id)
	if err != nil {
		return ""
	}
	return r.State
}
