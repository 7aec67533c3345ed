package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agent-wrap/agent-wrap/rundir"
)

// SchemaVersion is the version of the PostgreSQL schema this agent-wrap
// writes: what Init makes or migrates to, and the only one it uses.
const SchemaVersion = 1

// migrations[v] takes a schema from version v to v+1.
var migrations = []string{
	0: `
CREATE TABLE agent_wrap_schema (
	one         boolean PRIMARY KEY DEFAULT true CHECK (one),
	version     integer NOT NULL,
	migrated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE agent_wrap_runs (
	run_id        text PRIMARY KEY,
	state         text NOT NULL,
	outcome       text NOT NULL DEFAULT '',
	owner_host    text NOT NULL DEFAULT '',
	owner_boot_id text NOT NULL DEFAULT '',
	owner_pid     integer NOT NULL DEFAULT 0,
	owner_start   bigint NOT NULL DEFAULT 0,
	heartbeat_at  timestamptz,
	created_at    timestamptz NOT NULL,
	updated_at    timestamptz NOT NULL DEFAULT now(),
	record        jsonb NOT NULL
);
CREATE INDEX agent_wrap_runs_unsettled ON agent_wrap_runs (run_id) WHERE state <> 'settled';
CREATE INDEX agent_wrap_runs_owner ON agent_wrap_runs (owner_host, owner_pid);
INSERT INTO agent_wrap_schema (version) VALUES (0);
`,
}

// Postgres is the PostgreSQL backend: the tables agent_wrap_schema and
// agent_wrap_runs in the database (and search_path) the URL names. Each
// record is a row keyed by its run ID (so a duplicate is refused by the
// primary key), its JSON in a jsonb column beside the columns the
// ownership rules query; every write is one statement or one transaction,
// committed before the call returns.
//
//   - An owner's Update writes only while the row is not settled; a
//     Heartbeat sets heartbeat_at = now() (the database's clock, which
//     OwnerGone then compares with the database's now()) for all of an
//     owner's runs in one UPDATE.
//   - Claim is SELECT ... FOR UPDATE SKIP LOCKED in a transaction that
//     stays open until Settle commits the settled row or Release rolls
//     back: a second claim skips the row (ErrBusy), and an owner's Update
//     waits, then finds the row settled (ErrLost).
//
// The URL's password (in the URL, $PGPASSWORD or the password file) is in
// no message: String and every error carry the URL with it cut out.
type Postgres struct {
	where string // the URL, password cut out
	pw    string
	db    querier
	close func()

	checkMu sync.Mutex
	checked bool
}

// querier is what pgx.Conn and pgxpool.Pool both do.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// OpenPostgres opens the ledger at a postgres:// URL. With pool false
// (a short command) it connects at once, on one connection, and checks the
// schema: ErrBadURL, ErrDenied, ErrUnreachable, ErrNoSchema or ErrSchema
// say what is wrong. With pool true (a controller) it makes a pgxpool
// (pool_max_conns in the URL, default 2) that connects when first used,
// and checks the schema at the first Create, so that a database away at
// the start is retried like one lost later.
func OpenPostgres(ctx context.Context, rawURL string, pool bool) (*Postgres, error) {
	p := &Postgres{where: Redact(rawURL)}
	if pool {
		cfg, err := pgxpool.ParseConfig(rawURL)
		if err != nil {
			return nil, p.badURL(err)
		}
		if !strings.Contains(rawURL, "pool_max_conns") {
			cfg.MaxConns = 2
		}
		cfg.MinConns = 0
		p.pw = cfg.ConnConfig.Password
		pl, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, p.badURL(err)
		}
		p.db, p.close = pl, pl.Close
		return p, nil
	}
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return nil, p.badURL(err)
	}
	p.pw = cfg.Password
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 15 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, p.wrap("connect", err)
	}
	p.db = conn
	p.close = func() { _ = conn.Close(context.Background()) }
	if err := p.check(ctx); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// OpenPostgresForInit connects for Init: no schema check.
func OpenPostgresForInit(ctx context.Context, rawURL string) (*Postgres, error) {
	p := &Postgres{where: Redact(rawURL)}
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return nil, p.badURL(err)
	}
	p.pw = cfg.Password
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 15 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, p.wrap("connect", err)
	}
	p.db = conn
	p.close = func() { _ = conn.Close(context.Background()) }
	return p, nil
}

// String is the URL without its password.
func (p *Postgres) String() string { return p.where }

// Close closes the connection or pool.
func (p *Postgres) Close() error {
	p.close()
	return nil
}

func (p *Postgres) badURL(err error) error {
	return fmt.Errorf("%w %s: %s", ErrBadURL, p.where, p.redact(err.Error()))
}

// Init creates the schema in an empty database or migrates an older one
// to SchemaVersion, in one transaction (serialised with any other Init by
// an advisory lock). It refuses a newer schema (ErrSchema), changing
// nothing. It returns the version found (-1: none) and the one now there.
func (p *Postgres) Init(ctx context.Context) (from, to int, err error) {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return 0, 0, p.wrap("begin", err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7297846572)`); err != nil {
		return 0, 0, p.wrap("lock", err)
	}
	from = -1
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('agent_wrap_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, 0, p.wrap("read the schema", err)
	}
	if exists {
		if err := tx.QueryRow(ctx, `SELECT version FROM agent_wrap_schema`).Scan(&from); err != nil {
			return 0, 0, p.wrap("read the schema version", err)
		}
	}
	if from > SchemaVersion {
		return from, from, p.newer(from)
	}
	for v := max(from, 0); v < SchemaVersion; v++ {
		if _, err := tx.Exec(ctx, migrations[v]); err != nil {
			return from, v, p.wrap(fmt.Sprintf("migrate to version %d", v+1), err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE agent_wrap_schema SET version = $1, migrated_at = now()`, SchemaVersion); err != nil {
		return from, from, p.wrap("record the version", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return from, from, p.wrap("commit", err)
	}
	p.checked = true
	return from, SchemaVersion, nil
}

func (p *Postgres) newer(v int) error {
	return fmt.Errorf("ledger %s: %w: its version is %d, this agent-wrap knows %d (a newer agent-wrap made it)", p.where, ErrSchema, v, SchemaVersion)
}

// check makes sure the database holds a ledger of SchemaVersion.
func (p *Postgres) check(ctx context.Context) error {
	p.checkMu.Lock()
	defer p.checkMu.Unlock()
	if p.checked {
		return nil
	}
	var v int
	err := p.db.QueryRow(ctx, `SELECT version FROM agent_wrap_schema`).Scan(&v)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "42P01": // undefined_table
		return fmt.Errorf("ledger %s: %w (no table agent_wrap_schema)", p.where, ErrNoSchema)
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("ledger %s: %w: agent_wrap_schema is empty", p.where, ErrSchema)
	case err != nil:
		return p.wrap("read the schema version", err)
	case v > SchemaVersion:
		return p.newer(v)
	case v < SchemaVersion:
		return fmt.Errorf("ledger %s: %w: its version is %d, this agent-wrap needs %d ('agent-wrap ledger init' migrates it)", p.where, ErrSchema, v, SchemaVersion)
	}
	p.checked = true
	return nil
}

// wrap names err's kind (ErrDenied, ErrUnreachable, ErrNoSchema) and cuts
// the password out of its text.
func (p *Postgres) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	msg := p.redact(err.Error())
	if de := (errDecode{}); errors.As(err, &de) {
		return fmt.Errorf("ledger %s: %s: %s", p.where, op, msg)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("ledger %s: %s: %w", p.where, op, context.Canceled)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "28") || pe.Code == "42501": // invalid authorization, insufficient privilege
			return fmt.Errorf("ledger %s: %w: %s", p.where, ErrDenied, msg)
		case pe.Code == "3D000": // invalid_catalog_name: no such database
			return fmt.Errorf("ledger %s: %w: %s", p.where, ErrNoSchema, msg)
		case pe.Code == "42P01":
			return fmt.Errorf("ledger %s: %w: %s", p.where, ErrNoSchema, msg)
		case strings.HasPrefix(pe.Code, "08"), pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", pe.Code == "53300":
			return fmt.Errorf("ledger %s: %w: %s", p.where, ErrUnreachable, msg)
		}
		return fmt.Errorf("ledger %s: %s: %s", p.where, op, msg)
	}
	// No answer from the server: a refused or broken connection, a timeout.
	return fmt.Errorf("ledger %s: %w: %s", p.where, ErrUnreachable, msg)
}

func (p *Postgres) redact(s string) string {
	if p.pw != "" {
		s = strings.ReplaceAll(s, p.pw, "xxxxx")
	}
	return s
}

var pwInURL = regexp.MustCompile(`(://[^:/@]*:)[^@/]*@`)
var pwParam = regexp.MustCompile(`(?i)([?&]password=)[^&]*`)

// Redact returns the ledger URL s with any password replaced by xxxxx
// (user:PASSWORD@ and password=PASSWORD); a directory comes back as it is.
func Redact(s string) string {
	if !IsURL(s) {
		return s
	}
	if u, err := url.Parse(s); err == nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return pwParam.ReplaceAllString(u.String(), "${1}xxxxx")
	}
	s = pwInURL.ReplaceAllString(s, "${1}xxxxx@")
	return pwParam.ReplaceAllString(s, "${1}xxxxx")
}

// row is what the ledger's statements write of a record.
func rowOf(r *Record) (owner Owner, rec []byte, err error) {
	if r.Controller != nil {
		owner = *r.Controller
	}
	rec, err = json.Marshal(r)
	return owner, rec, err
}

// Create inserts the run's row; the primary key refuses a duplicate
// (ErrExists, nothing written).
func (p *Postgres) Create(ctx context.Context, r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	if err := p.check(ctx); err != nil {
		return err
	}
	r.Schema = 1
	r.UpdatedAt = time.Now().UTC()
	o, b, err := rowOf(r)
	if err != nil {
		return err
	}
	var hb time.Time
	err = p.db.QueryRow(ctx, `INSERT INTO agent_wrap_runs
		(run_id, state, outcome, owner_host, owner_boot_id, owner_pid, owner_start, heartbeat_at, created_at, record)
		VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $4 <> '' THEN now() END, $8, $9)
		RETURNING coalesce(heartbeat_at, 'epoch')`,
		r.RunID, r.State, r.Outcome, o.Host, o.BootID, o.PID, int64(o.Start), r.CreatedAt, b).Scan(&hb)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
		return fmt.Errorf("run %s: %w (%s)", r.RunID, ErrExists, p.where)
	}
	if err != nil {
		return p.wrap("create run "+r.RunID, err)
	}
	if r.Controller != nil {
		r.HeartbeatAt = hb.UTC()
	}
	return nil
}

// Update replaces the run's row as its owner, only while it is not
// settled: ErrLost otherwise, ErrNoRecord if there is none.
func (p *Postgres) Update(ctx context.Context, r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	r.Schema = 1
	r.UpdatedAt = time.Now().UTC()
	_, b, err := rowOf(r)
	if err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, `UPDATE agent_wrap_runs SET state = $2, outcome = $3, record = $4, updated_at = now(),
		heartbeat_at = CASE WHEN $2 <> 'settled' AND owner_host <> '' THEN now() ELSE heartbeat_at END
		WHERE run_id = $1 AND state <> 'settled'`, r.RunID, r.State, r.Outcome, b)
	if err != nil {
		return p.wrap("update run "+r.RunID, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	cur, err := p.Read(ctx, r.RunID)
	if err != nil {
		return err
	}
	return fmt.Errorf("run %s: %w (%s)", r.RunID, ErrLost, settledWhen(cur))
}

const (
	recordCols   = `record, coalesce(heartbeat_at, 'epoch')`
	selectRecord = `SELECT ` + recordCols + ` FROM agent_wrap_runs`
)

// errDecode marks a row that was read but does not decode: not the
// connection's fault.
type errDecode struct{ err error }

func (e errDecode) Error() string { return "a record that does not decode: " + e.err.Error() }

func scanRecord(row pgx.Row, extra ...any) (*Record, error) {
	var b []byte
	var hb time.Time
	if err := row.Scan(append([]any{&b, &hb}, extra...)...); err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, errDecode{err}
	}
	if hb.Unix() > 0 {
		r.HeartbeatAt = hb.UTC()
	}
	return &r, nil
}

// Read returns the run's record; ErrNoRecord if there is no row.
func (p *Postgres) Read(ctx context.Context, id string) (*Record, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	r, err := scanRecord(p.db.QueryRow(ctx, selectRecord+` WHERE run_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("run %s: %w (%s)", id, ErrNoRecord, p.where)
	}
	if err != nil {
		return nil, p.wrap("read run "+id, err)
	}
	return r, nil
}

// List returns the records f selects, sorted by run ID.
func (p *Postgres) List(ctx context.Context, f Filter) ([]*Record, error) {
	q := selectRecord
	var where []string
	var args []any
	if f.Unsettled {
		where = append(where, `(state <> 'settled' OR outcome = 'unknown')`)
	}
	if f.Controller != "" {
		host, pid, hasPID := strings.Cut(f.Controller, ":")
		args = append(args, host)
		where = append(where, fmt.Sprintf("owner_host = $%d", len(args)))
		if hasPID {
			args = append(args, pid)
			where = append(where, fmt.Sprintf("owner_pid::text = $%d", len(args)))
		}
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	rows, err := p.db.Query(ctx, q+" ORDER BY run_id", args...)
	if err != nil {
		return nil, p.wrap("list", err)
	}
	defer rows.Close()
	var recs []*Record
	var errs []error
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			errs = append(errs, p.wrap("list", err))
			continue
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, p.wrap("list", err)
	}
	return recs, errors.Join(errs...)
}

// Heartbeat sets heartbeat_at = now() for o's unsettled runs among ids,
// in one statement.
func (p *Postgres) Heartbeat(ctx context.Context, o *Owner, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := p.db.Exec(ctx, `UPDATE agent_wrap_runs SET heartbeat_at = now()
		WHERE run_id = ANY($1) AND state <> 'settled'
		AND owner_host = $2 AND owner_boot_id = $3 AND owner_pid = $4 AND owner_start = $5`,
		ids, o.Host, o.BootID, o.PID, int64(o.Start))
	return p.wrap("heartbeat", err)
}

// Claim locks the run's row (SELECT ... FOR UPDATE SKIP LOCKED) in a
// transaction held until Settle or Release. A row another transaction
// holds is ErrBusy.
func (p *Postgres) Claim(ctx context.Context, id string) (*Claim, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return nil, p.wrap("begin", err)
	}
	var now time.Time
	r, err := scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+`, now() FROM agent_wrap_runs WHERE run_id = $1 FOR UPDATE SKIP LOCKED`, id), &now)
	if err != nil {
		tx.Rollback(context.Background())
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, p.wrap("claim run "+id, err)
		}
		if _, rerr := p.Read(ctx, id); rerr != nil {
			return nil, rerr
		}
		return nil, fmt.Errorf("run %s: %w", id, ErrBusy)
	}
	return &Claim{
		Record: r, Now: now.UTC(),
		settle: func(ctx context.Context, r *Record) error {
			defer tx.Rollback(context.Background())
			r.Schema = 1
			r.UpdatedAt = time.Now().UTC()
			_, b, err := rowOf(r)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE agent_wrap_runs SET state = $2, outcome = $3, record = $4, updated_at = now()
				WHERE run_id = $1`, r.RunID, r.State, r.Outcome, b); err != nil {
				return p.wrap("settle run "+r.RunID, err)
			}
			return p.wrap("commit the settle of "+r.RunID, tx.Commit(ctx))
		},
		release: func() { tx.Rollback(context.Background()) },
	}, nil
}
