package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/pgtest"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The PostgreSQL ledger: a schedule with a controller run drawn PG starts
// a server of its own (internal/pgtest: initdb and postgres as uid 65534,
// on a unix socket in a directory of its own), makes a database for the
// schedule and `agent-wrap ledger init`s it. A server per schedule, not per
// campaign: a SIGKILLed backend makes the postmaster reset every
// connection, and a stopped postmaster stalls every new one, so a shared
// server would carry one schedule's faults into the others played beside
// it. Starting one costs about a second (0.9 s measured, initdb included,
// at load 3.6 on two cores) in a schedule of 20 to 40.

// pgSide is a schedule's PostgreSQL server and ledger database.
type pgSide struct {
	srv *pgtest.Server
	db  string
}

// startPG starts the server, makes the schedule's database and its ledger
// schema.
func (p *player) startPG() (*pgSide, error) {
	if err := pgtest.Missing(); err != nil {
		return nil, err
	}
	srv, err := pgtest.Start()
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL for the ledger: %w", err)
	}
	side := &pgSide{srv: srv}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if side.db, err = srv.NewDB(ctx); err != nil {
		srv.Stop()
		return nil, fmt.Errorf("PostgreSQL for the ledger: %w", err)
	}
	if code, out := p.exec(p.users[0], 60*time.Second, "ledger", "init", "--ledger", side.url("")); code != 0 {
		srv.Stop()
		return nil, fmt.Errorf("agent-wrap ledger init exited %d: %s", code, out)
	}
	return side, nil
}

// url is the ledger's URL; with app, the connection's application_name,
// by which pg_stat_activity names the backend serving one controller.
func (s *pgSide) url(app string) string {
	u := s.srv.URL("postgres", s.db)
	if app != "" {
		u += "&application_name=" + url.QueryEscape(app)
	}
	return u
}

// appOf is the application_name of run r's controller.
func appOf(r *runState) string { return "awchaos-" + r.id }

// ledgerArg is the --ledger of run r's controller, settles and readers.
func (p *player) ledgerArg(r *runState) string {
	if r.spec.PG && p.pg != nil {
		return p.pg.url(appOf(r))
	}
	return p.ssh.ledger
}

// postmaster is the server's postmaster, by postmaster.pid and its start
// time (zero when it is not running).
func (s *pgSide) postmaster() proc.Identity {
	pid := s.srv.PID()
	if pid <= 1 {
		return proc.Identity{}
	}
	st, err := proc.ReadStat(pid)
	if err != nil || st.Dead() {
		return proc.Identity{}
	}
	return proc.Identity{PID: pid, Start: st.Start}
}

// backendsOf are the backends serving the connections named app, as
// pg_stat_activity lists them, each checked to be a child of the
// postmaster (a PID from the server is a claim to verify). A query
// that does not answer within a second (the postmaster stopped) finds
// none.
func (s *pgSide) backendsOf(app string) []proc.Identity {
	pm := s.postmaster()
	if pm.PID == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rows, err := s.srv.Query(ctx, "postgres", `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil
	}
	var out []proc.Identity
	for _, row := range rows {
		pid, err := strconv.Atoi(row[0])
		if err != nil {
			continue
		}
		st, err := proc.ReadStat(pid)
		if err != nil || st.Dead() || st.PPID != pm.PID {
			continue
		}
		out = append(out, proc.Identity{PID: pid, Start: st.Start})
	}
	return out
}

// pgLedgerOf reads run r's record from the PostgreSQL ledger through
// `agent-wrap ledger --json` (nil if it lists none; the error if the
// command failed).
func (p *player) pgLedgerOf(r *runState) (map[string]any, error) {
	code, out := p.exec(p.users[0], 60*time.Second, "ledger", "--json", "--ledger", p.pg.url(""))
	if code != 0 {
		return nil, fmt.Errorf("agent-wrap ledger --json exited %d: %s", code, out)
	}
	for _, line := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["run_id"] == r.id {
			return m, nil
		}
	}
	return nil, nil
}
