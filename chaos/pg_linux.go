package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/pgtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/stop"
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

	mu sync.Mutex
	pm proc.Identity // the postmaster started last; zero while it is down
	// restarts counts the kill-postmaster restarts still to come: the
	// ledger is judged only once the server is up again.
	restarts sync.WaitGroup
}

// up waits, at most d, until no restart of the server is pending.
func (g *pgSide) up(d time.Duration) bool {
	done := make(chan struct{})
	go func() { g.restarts.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
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
	side.pm = side.started()
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

// started is the identity of the postmaster just started, by
// postmaster.pid and its start time.
func (s *pgSide) started() proc.Identity {
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

// postmaster is the server's postmaster while it runs (zero once it was
// killed, until it is restarted): the identity recorded when it started,
// still alive with that start time.
func (s *pgSide) postmaster() proc.Identity {
	s.mu.Lock()
	pm := s.pm
	s.mu.Unlock()
	if pm.PID <= 1 {
		return proc.Identity{}
	}
	st, err := proc.ReadStat(pm.PID)
	if err != nil || st.Dead() || st.Start != pm.Start {
		return proc.Identity{}
	}
	return pm
}

// killPostmaster SIGKILLs the postmaster by PID and start time, waits for
// it and its backends (which see it gone) to exit, and restarts the
// server on the same data directory and port after pause: the database
// away, then back after its crash recovery. The restart is skipped once
// the schedule ends (the teardown stops what runs).
func (p *player) killPostmaster(pause time.Duration) (bool, string) {
	pm := p.pg.postmaster()
	if pm.PID <= 1 {
		return false, "the postmaster is down"
	}
	backends := childrenOf(pm.PID, nil)
	if err := stop.Signal(pm, unix.SIGKILL); err != nil {
		return false, err.Error()
	}
	p.pg.mu.Lock()
	p.pg.pm = proc.Identity{}
	p.pg.mu.Unlock()
	if err := p.pg.srv.Reap(10 * time.Second); err != nil {
		return true, err.Error()
	}
	p.pg.restarts.Add(1)
	go func() {
		defer p.pg.restarts.Done()
		select {
		case <-time.After(pause):
		case <-p.quit: // the schedule is over: restart now, for its ledger to be judged
		}
		for _, b := range backends {
			p.cont(b) // a backend the nemesis stopped cannot see its postmaster gone
		}
		gone := func() bool {
			for _, b := range backends {
				if st, err := proc.ReadStat(b.PID); err == nil && !st.Dead() && st.Start == b.Start {
					return false
				}
			}
			return true
		}
		// Not p.within: it gives up once the schedule is over, and a
		// restart beside the old backends would fail.
		for until := time.Now().Add(10 * time.Second); !gone() && time.Now().Before(until); {
			time.Sleep(20 * time.Millisecond)
		}
		if err := p.pg.srv.Restart(); err != nil {
			p.logf("PostgreSQL: restart after kill-postmaster: %v", err)
			return
		}
		pm := p.pg.started()
		p.pg.mu.Lock()
		p.pg.pm = pm
		p.pg.mu.Unlock()
		p.logf("PostgreSQL: restarted (postmaster pid %d)", pm.PID)
	}()
	return true, fmt.Sprintf("postmaster pid %d (%d backends), restart after %v", pm.PID, len(backends), pause)
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
