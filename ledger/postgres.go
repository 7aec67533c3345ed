package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

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
//   - It speaks the protocol through pgconn alone (text parameters, text
//     results parsed here), on one connection shared by the process's
//     calls, one call at a time: the connection is made at the first call
//     and made again after it breaks (a database restarted, a timeout).
//     A claim has a connection of its own for its transaction, kept for
//     the next claim; so a controller holds one connection, a settle two.
//   - An owner's Update writes only while the row is not settled; a
//     Heartbeat sets heartbeat_at = now() (the database's clock, which
//     OwnerGone then compares with the database's now()) for all of an
//     owner's runs in one UPDATE, skipping a row a claim holds.
//   - Claim is SELECT ... FOR UPDATE SKIP LOCKED in a transaction that
//     stays open until Settle commits the settled row or Release rolls
//     back: a second claim skips the row (ErrBusy), and an owner's Update
//     waits for it (at most lock_timeout, 5 s unless the URL sets it; then
//     ErrBusy, which the controller retries), then finds the row settled
//     (ErrLost) or writes.
//
// The URL's password (in the URL, $PGPASSWORD or the password file) is in
// no message: String and every error carry the URL with it cut out.
type Postgres struct {
	where string // the URL, password cut out
	pw    string
	cfg   *pgconn.Config

	mu   sync.Mutex     // one call at a time on conn
	conn *pgconn.PgConn // nil until the first call, and after it broke

	spareMu sync.Mutex
	spare   *pgconn.PgConn // an ended claim's connection, for the next claim

	checkMu sync.Mutex
	checked bool
}

// parse reads the URL with libpq's conventions (pgconn.ParseConfig:
// PGPASSWORD, PGPASSFILE, sslmode, host=/socket/dir, ...).
func parse(rawURL string) (*Postgres, error) {
	p := &Postgres{where: Redact(rawURL)}
	cfg, err := pgconn.ParseConfig(rawURL)
	if err != nil {
		return nil, p.badURL(err)
	}
	p.pw, p.cfg = cfg.Password, cfg
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 15 * time.Second
	}
	if _, set := cfg.RuntimeParams["lock_timeout"]; !set {
		cfg.RuntimeParams["lock_timeout"] = "5s"
	}
	if _, set := cfg.RuntimeParams["application_name"]; !set {
		cfg.RuntimeParams["application_name"] = "agent-wrap"
	}
	return p, nil
}

// OpenPostgres opens the ledger at a postgres:// URL. With lazy false (a
// short command) it connects at once and checks the schema: ErrBadURL,
// ErrDenied, ErrUnreachable, ErrNoSchema or ErrSchema say what is wrong.
// With lazy true (a controller) it connects at the first call and checks
// the schema at the first Create, so that a database away at the start is
// retried like one lost later.
func OpenPostgres(ctx context.Context, rawURL string, lazy bool) (*Postgres, error) {
	p, err := parse(rawURL)
	if err != nil || lazy {
		return p, err
	}
	if err := p.check(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// OpenPostgresForInit connects for Init: no schema check.
func OpenPostgresForInit(ctx context.Context, rawURL string) (*Postgres, error) {
	p, err := parse(rawURL)
	if err != nil {
		return nil, err
	}
	if err := p.with(ctx, "connect", func(*pgconn.PgConn) error { return nil }); err != nil {
		return nil, err
	}
	return p, nil
}

// String is the URL without its password.
func (p *Postgres) String() string { return p.where }

// Close closes the connections.
func (p *Postgres) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.mu.Lock()
	if p.conn != nil {
		p.conn.Close(ctx)
		p.conn = nil
	}
	p.mu.Unlock()
	p.spareMu.Lock()
	if p.spare != nil {
		p.spare.Close(ctx)
		p.spare = nil
	}
	p.spareMu.Unlock()
	return nil
}

func (p *Postgres) badURL(err error) error {
	return fmt.Errorf("%w %s: %s", ErrBadURL, p.where, p.redact(err.Error()))
}

func (p *Postgres) dial(ctx context.Context) (*pgconn.PgConn, error) {
	c, err := pgconn.ConnectConfig(ctx, p.cfg)
	if err != nil {
		return nil, p.wrap("connect", err)
	}
	return c, nil
}

// with runs f on the shared connection, one call at a time, connecting
// first when there is none. A transaction f leaves open is rolled back; a
// connection that broke is dropped, for the next call to make anew. f's
// error comes back wrapped as op (p.wrap).
func (p *Postgres) with(ctx context.Context, op string, f func(c *pgconn.PgConn) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil && p.conn.IsClosed() {
		p.conn = nil
	}
	if p.conn == nil {
		c, err := p.dial(ctx)
		if err != nil {
			return err
		}
		p.conn = c
	}
	err := f(p.conn)
	p.conn = p.tidy(p.conn)
	if errors.As(err, new(errPlain)) {
		return err
	}
	return p.wrap(op, err)
}

// tidy rolls back what c left open; it returns c, or nil when c is broken
// (and closed).
func (p *Postgres) tidy(c *pgconn.PgConn) *pgconn.PgConn {
	if !c.IsClosed() && c.TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Exec(ctx, "ROLLBACK").ReadAll()
		cancel()
		if err != nil {
			c.Close(context.Background())
		}
	}
	if c.IsClosed() {
		return nil
	}
	return c
}

// errPlain is an error f already said in full: with passes it on as it is.
type errPlain struct{ error }

func (e errPlain) Unwrap() error { return e.error }

// query runs one statement, its arguments sent as text (see param), and
// returns its rows as text.
func query(ctx context.Context, c *pgconn.PgConn, sql string, args ...any) (*pgconn.Result, error) {
	vals := make([][]byte, len(args))
	for i, a := range args {
		vals[i] = param(a)
	}
	res := c.ExecParams(ctx, sql, vals, nil, nil, nil).Read()
	return res, res.Err
}

// param is an argument's text form: a string as it is, a number in
// decimal, a time in RFC 3339 with nanoseconds (the server keeps
// microseconds), a []string as an array literal, nil as NULL.
func param(a any) []byte {
	switch v := a.(type) {
	case nil:
		return nil
	case string:
		return []byte(v)
	case []byte:
		return v
	case int:
		return strconv.AppendInt(nil, int64(v), 10)
	case int64:
		return strconv.AppendInt(nil, v, 10)
	case uint64:
		return strconv.AppendUint(nil, v, 10)
	case time.Time:
		return []byte(v.UTC().Format(time.RFC3339Nano))
	case []string:
		b := []byte{'{'}
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			for _, ch := range []byte(s) {
				if ch == '"' || ch == '\\' {
					b = append(b, '\\')
				}
				b = append(b, ch)
			}
			b = append(b, '"')
		}
		return append(b, '}')
	}
	panic(fmt.Sprintf("ledger: no text form for %T", a))
}

// micros is a timestamptz column as microseconds since the epoch, read
// back by atMicros: a form that no DateStyle or TimeZone setting changes.
func micros(col string) string {
	return `(extract(epoch FROM coalesce(` + col + `, 'epoch')) * 1000000)::bigint`
}

// atMicros parses micros' text; the epoch itself (a NULL) is the zero time.
func atMicros(b []byte) (time.Time, error) {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return time.Time{}, errDecode{fmt.Errorf("a time of %q: %v", b, err)}
	}
	if n == 0 {
		return time.Time{}, nil
	}
	return time.UnixMicro(n).UTC(), nil
}

func atoi(b []byte) (int, error) {
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return 0, errDecode{fmt.Errorf("a number of %q: %v", b, err)}
	}
	return n, nil
}

// Init creates the schema in an empty database or migrates an older one
// to SchemaVersion, in one transaction (serialised with any other Init by
// an advisory lock). It refuses a newer schema (ErrSchema), changing
// nothing. It returns the version found (-1: none) and the one now there.
func (p *Postgres) Init(ctx context.Context) (from, to int, err error) {
	from, to = -1, -1
	err = p.with(ctx, "init", func(c *pgconn.PgConn) error {
		if _, err := c.Exec(ctx, `BEGIN; SET LOCAL lock_timeout = 0; SELECT pg_advisory_xact_lock(7297846572)`).ReadAll(); err != nil {
			return err
		}
		res, err := query(ctx, c, `SELECT to_regclass('agent_wrap_schema') IS NOT NULL`)
		if err != nil {
			return err
		}
		if string(res.Rows[0][0]) == "t" {
			res, err := query(ctx, c, `SELECT version FROM agent_wrap_schema`)
			if err != nil {
				return err
			}
			if len(res.Rows) != 1 {
				return errPlain{fmt.Errorf("ledger %s: %w: agent_wrap_schema holds %d rows", p.where, ErrSchema, len(res.Rows))}
			}
			if from, err = atoi(res.Rows[0][0]); err != nil {
				return err
			}
		}
		if from > SchemaVersion {
			to = from
			return errPlain{p.newer(from)}
		}
		if from == SchemaVersion {
			// Current already: write nothing, not even migrated_at.
			_, err := c.Exec(ctx, "ROLLBACK").ReadAll()
			return err
		}
		for v := max(from, 0); v < SchemaVersion; v++ {
			if _, err := c.Exec(ctx, migrations[v]).ReadAll(); err != nil {
				return fmt.Errorf("migrate to version %d: %w", v+1, err)
			}
		}
		if _, err := query(ctx, c, `UPDATE agent_wrap_schema SET version = $1, migrated_at = now()`, SchemaVersion); err != nil {
			return err
		}
		return commit(ctx, c)
	})
	if err != nil {
		return from, max(from, to), err
	}
	p.checkMu.Lock()
	p.checked = true
	p.checkMu.Unlock()
	return from, SchemaVersion, nil
}

// commit commits c's transaction: an error unless the server says COMMIT
// (a failed transaction's COMMIT answers ROLLBACK).
func commit(ctx context.Context, c *pgconn.PgConn) error {
	res, err := c.Exec(ctx, "COMMIT").ReadAll()
	if err != nil {
		return err
	}
	if len(res) != 1 || res[0].CommandTag.String() != "COMMIT" {
		return errors.New("the transaction was rolled back")
	}
	return nil
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
	err := p.with(ctx, "read the schema version", func(c *pgconn.PgConn) error {
		res, err := query(ctx, c, `SELECT version FROM agent_wrap_schema`)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
			return errPlain{fmt.Errorf("ledger %s: %w (no table agent_wrap_schema)", p.where, ErrNoSchema)}
		}
		if err != nil {
			return err
		}
		if len(res.Rows) == 0 {
			return errPlain{fmt.Errorf("ledger %s: %w: agent_wrap_schema is empty", p.where, ErrSchema)}
		}
		v, err := atoi(res.Rows[0][0])
		switch {
		case err != nil:
			return err
		case v > SchemaVersion:
			return errPlain{p.newer(v)}
		case v < SchemaVersion:
			return errPlain{fmt.Errorf("ledger %s: %w: its version is %d, this agent-wrap needs %d ('agent-wrap ledger init' migrates it)", p.where, ErrSchema, v, SchemaVersion)}
		}
		return nil
	})
	if err == nil {
		p.checked = true
	}
	return err
}

// wrap names err's kind (ErrDenied, ErrUnreachable, ErrNoSchema, ErrBusy)
// and cuts the password out of its text.
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
			return &NoDatabaseError{Where: p.where, Database: p.cfg.Database, Createdb: p.createdb(), msg: msg}
		case pe.Code == "42P01":
			return fmt.Errorf("ledger %s: %w: %s", p.where, ErrNoSchema, msg)
		case pe.Code == "55P03": // lock_not_available: a claim holds the row past lock_timeout
			return fmt.Errorf("ledger %s: %s: %w (%s)", p.where, op, ErrBusy, msg)
		case strings.HasPrefix(pe.Code, "08"), pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", pe.Code == "53300":
			return fmt.Errorf("ledger %s: %w: %s", p.where, ErrUnreachable, msg)
		}
		return fmt.Errorf("ledger %s: %s: %s", p.where, op, msg)
	}
	// No answer from the server: a refused or broken connection, a timeout.
	return fmt.Errorf("ledger %s: %w: %s", p.where, ErrUnreachable, msg)
}

// NoDatabaseError is the server's answer for a URL that names a database
// it does not have (errors.Is ErrNoDatabase). Createdb is the command that
// makes it, as argv: nothing creates a database silently.
type NoDatabaseError struct {
	Where    string // the URL without its password
	Database string
	Createdb []string
	msg      string
}

func (e *NoDatabaseError) Error() string {
	return fmt.Sprintf("ledger %s: %v: the server has no database %q (%s)", e.Where, ErrNoDatabase, e.Database, e.msg)
}

// Is makes errors.Is(err, ErrNoDatabase) true.
func (e *NoDatabaseError) Is(target error) bool { return target == ErrNoDatabase }

// createdb is PostgreSQL's createdb command line for the URL's database,
// on its server, as its user.
func (p *Postgres) createdb() []string {
	argv := []string{"createdb"}
	if p.cfg.Host != "" {
		argv = append(argv, "-h", p.cfg.Host)
	}
	if p.cfg.Port != 0 && p.cfg.Port != 5432 {
		argv = append(argv, "-p", strconv.Itoa(int(p.cfg.Port)))
	}
	if p.cfg.User != "" {
		argv = append(argv, "-U", p.cfg.User)
	}
	return append(argv, p.cfg.Database)
}

func (p *Postgres) redact(s string) string {
	if p.pw != "" {
		s = strings.ReplaceAll(s, p.pw, "xxxxx")
	}
	return s
}

// Compiled on first use, not at every start of the binary.
var (
	pwInURL = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(://[^:/@]*:)[^@/]*@`) })
	pwParam = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?i)([?&]password=)[^&]*`) })
)

// Redact returns the ledger URL s with any password replaced by xxxxx
// (user:PASSWORD@ and password=PASSWORD); a directory comes back as it is.
func Redact(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	if u, err := url.Parse(s); err == nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return pwParam().ReplaceAllString(u.String(), "${1}xxxxx")
	}
	s = pwInURL().ReplaceAllString(s, "${1}xxxxx@")
	return pwParam().ReplaceAllString(s, "${1}xxxxx")
}

// encode is the record's JSON, as the record column holds it.
func encode(r *Record) ([]byte, error) {
	r.Schema = 1
	r.UpdatedAt = time.Now().UTC()
	return json.Marshal(r)
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
	var o Owner
	if r.Controller != nil {
		o = *r.Controller
	}
	b, err := encode(r)
	if err != nil {
		return err
	}
	var hb time.Time
	err = p.with(ctx, "create run "+r.RunID, func(c *pgconn.PgConn) error {
		res, err := query(ctx, c, `INSERT INTO agent_wrap_runs
			(run_id, state, outcome, owner_host, owner_boot_id, owner_pid, owner_start, heartbeat_at, created_at, record)
			VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $4 <> '' THEN now() END, $8, $9)
			RETURNING `+micros("heartbeat_at"),
			r.RunID, r.State, r.Outcome, o.Host, o.BootID, o.PID, int64(o.Start), r.CreatedAt, b)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
			return errPlain{fmt.Errorf("run %s: %w (%s)", r.RunID, ErrExists, p.where)}
		}
		if err != nil {
			return err
		}
		hb, err = atMicros(res.Rows[0][0])
		return err
	})
	if err != nil {
		return err
	}
	if r.Controller != nil {
		r.HeartbeatAt = hb
	}
	return nil
}

// Update replaces the run's row as its owner, only while it is not
// settled: ErrLost otherwise, ErrNoRecord if there is none.
func (p *Postgres) Update(ctx context.Context, r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	b, err := encode(r)
	if err != nil {
		return err
	}
	var n int64
	err = p.with(ctx, "update run "+r.RunID, func(c *pgconn.PgConn) error {
		res, err := query(ctx, c, `UPDATE agent_wrap_runs SET state = $2, outcome = $3, record = $4, updated_at = now(),
			heartbeat_at = CASE WHEN $2 <> 'settled' AND owner_host <> '' THEN now() ELSE heartbeat_at END
			WHERE run_id = $1 AND state <> 'settled'`, r.RunID, r.State, r.Outcome, b)
		if err == nil {
			n = res.CommandTag.RowsAffected()
		}
		return err
	})
	if err != nil || n == 1 {
		return err
	}
	cur, err := p.Read(ctx, r.RunID)
	if err != nil {
		return err
	}
	return fmt.Errorf("run %s: %w (%s)", r.RunID, ErrLost, settledWhen(cur))
}

// recordCols are the columns decode reads: the record, its heartbeat.
var recordCols = `record, ` + micros("heartbeat_at")

// errDecode marks a row that was read but does not decode: not the
// connection's fault.
type errDecode struct{ err error }

func (e errDecode) Error() string { return "a record that does not decode: " + e.err.Error() }

// decode makes a Record of a row's record and heartbeat columns.
func decode(row [][]byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(row[0], &r); err != nil {
		return nil, errDecode{err}
	}
	hb, err := atMicros(row[1])
	if err != nil {
		return nil, err
	}
	if !hb.IsZero() {
		r.HeartbeatAt = hb
	}
	return &r, nil
}

// Read returns the run's record; ErrNoRecord if there is no row.
func (p *Postgres) Read(ctx context.Context, id string) (*Record, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	var r *Record
	err := p.with(ctx, "read run "+id, func(c *pgconn.PgConn) error {
		res, err := query(ctx, c, `SELECT `+recordCols+` FROM agent_wrap_runs WHERE run_id = $1`, id)
		if err != nil {
			return err
		}
		if len(res.Rows) == 0 {
			return errPlain{fmt.Errorf("run %s: %w (%s)", id, ErrNoRecord, p.where)}
		}
		r, err = decode(res.Rows[0])
		return err
	})
	return r, err
}

// List returns the records f selects, sorted by run ID.
func (p *Postgres) List(ctx context.Context, f Filter) ([]*Record, error) {
	q := `SELECT run_id, ` + recordCols + ` FROM agent_wrap_runs`
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
	var rows [][][]byte
	err := p.with(ctx, "list", func(c *pgconn.PgConn) error {
		res, err := query(ctx, c, q+" ORDER BY run_id", args...)
		if err == nil {
			rows = res.Rows
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	var recs []*Record
	var errs []error
	for _, row := range rows {
		r, err := decode(row[1:])
		if err != nil {
			errs = append(errs, p.wrap("list: run "+string(row[0]), err))
			continue
		}
		recs = append(recs, r)
	}
	return recs, errors.Join(errs...)
}

// Heartbeat sets heartbeat_at = now() for o's unsettled runs among ids,
// in one statement. A row a claim holds is skipped, not waited for: its
// settle is judging it.
func (p *Postgres) Heartbeat(ctx context.Context, o *Owner, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	return p.with(ctx, "heartbeat", func(c *pgconn.PgConn) error {
		_, err := query(ctx, c, `UPDATE agent_wrap_runs SET heartbeat_at = now() WHERE run_id IN (
			SELECT run_id FROM agent_wrap_runs
			WHERE run_id = ANY($1::text[]) AND state <> 'settled'
			AND owner_host = $2 AND owner_boot_id = $3 AND owner_pid = $4 AND owner_start = $5
			FOR UPDATE SKIP LOCKED)`,
			ids, o.Host, o.BootID, o.PID, int64(o.Start))
		return err
	})
}

// Claim locks the run's row (SELECT ... FOR UPDATE SKIP LOCKED) in a
// transaction, on a connection of the claim's own, held until Settle or
// Release. A row another transaction holds is ErrBusy.
func (p *Postgres) Claim(ctx context.Context, id string) (*Claim, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	p.spareMu.Lock()
	c := p.spare
	p.spare = nil
	p.spareMu.Unlock()
	if c == nil || c.IsClosed() {
		var err error
		if c, err = p.dial(ctx); err != nil {
			return nil, err
		}
	}
	var res *pgconn.Result
	_, err := c.Exec(ctx, "BEGIN").ReadAll()
	if err == nil {
		res, err = query(ctx, c, `SELECT `+recordCols+`, `+micros("now()")+` FROM agent_wrap_runs WHERE run_id = $1 FOR UPDATE SKIP LOCKED`, id)
	}
	var r *Record
	var now time.Time
	if err == nil && len(res.Rows) == 1 {
		if r, err = decode(res.Rows[0]); err == nil {
			now, err = atMicros(res.Rows[0][2])
		}
	}
	if err != nil || r == nil {
		p.putBack(c)
		if err != nil {
			return nil, p.wrap("claim run "+id, err)
		}
		if _, rerr := p.Read(ctx, id); rerr != nil {
			return nil, rerr
		}
		return nil, fmt.Errorf("run %s: %w", id, ErrBusy)
	}
	return &Claim{
		Record: r, Now: now,
		settle: func(ctx context.Context, r *Record) error {
			defer p.putBack(c)
			b, err := encode(r)
			if err != nil {
				return err
			}
			if _, err := query(ctx, c, `UPDATE agent_wrap_runs SET state = $2, outcome = $3, record = $4, updated_at = now()
				WHERE run_id = $1`, r.RunID, r.State, r.Outcome, b); err != nil {
				return p.wrap("settle run "+r.RunID, err)
			}
			return p.wrap("commit the settle of "+r.RunID, commit(ctx, c))
		},
		release: func() { p.putBack(c) },
	}, nil
}

// putBack ends what a claim's connection has open and keeps it for the
// next claim (one is kept; another is closed).
func (p *Postgres) putBack(c *pgconn.PgConn) {
	if c = p.tidy(c); c == nil {
		return
	}
	p.spareMu.Lock()
	defer p.spareMu.Unlock()
	if p.spare == nil {
		p.spare = c
		return
	}
	c.Close(context.Background())
}
