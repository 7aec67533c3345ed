package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// What a database that is not a ledger of this version says: each a
// clear error of its kind, and nothing written.
func TestPostgresRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pg.NewDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, db, `CREATE ROLE runner LOGIN PASSWORD 'right-pw'`); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		url  string
		want error
	}{
		{"bad URL", "postgres://u@host:notaport/x", ErrBadURL},
		{"wrong password", pg.TCPURL("runner", "wrong-pw", db), ErrDenied},
		{"uninitialised", pg.URL("postgres", db), ErrNoSchema},
		{"no such database", pg.URL("postgres", "nodb"), ErrNoDatabase},
		{"nothing listening", "postgres://u@127.0.0.1:1/x?connect_timeout=5", ErrUnreachable},
	}
	for _, tc := range cases {
		_, err := OpenPostgres(ctx, tc.url, false)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "wrong-pw") {
			t.Errorf("%s: the password is in the message: %v", tc.name, err)
		}
	}
	// A missing database is named, with the createdb command that makes it
	// (on the URL's server, as its user), at open and at init alike.
	for _, open := range []func() error{
		func() error { _, err := OpenPostgres(ctx, pg.URL("postgres", "nodb"), false); return err },
		func() error { _, err := OpenPostgresForInit(ctx, pg.URL("postgres", "nodb")); return err },
	} {
		err := open()
		var nd *NoDatabaseError
		if !errors.As(err, &nd) || errors.Is(err, ErrNoSchema) || !strings.Contains(err.Error(), `no database "nodb"`) {
			t.Fatalf("open a missing database: %v, want a NoDatabaseError naming nodb", err)
		}
		if got := strings.Join(nd.Createdb, " "); !strings.HasPrefix(got, "createdb -h ") || !strings.HasSuffix(got, " -U postgres nodb") {
			t.Errorf("createdb command: %q", got)
		}
	}
	// The pool (a controller) finds the missing schema at its first
	// Create, and writes nothing.
	p, err := OpenPostgres(ctx, pg.URL("postgres", db), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Create(ctx, &Record{RunID: "x", State: Launching}); !errors.Is(err, ErrNoSchema) {
		t.Errorf("Create in an empty database: %v, want ErrNoSchema", err)
	}
	p.Close()
	var tables int
	if err := queryInt(ctx, db, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'agent_wrap%'`, &tables); err != nil || tables != 0 {
		t.Fatalf("an empty database gained %d tables (%v)", tables, err)
	}

	// init makes it; a second init changes nothing.
	in, err := OpenPostgresForInit(ctx, pg.URL("postgres", db))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if from, to, err := in.Init(ctx); err != nil || from != -1 || to != SchemaVersion {
		t.Fatalf("init: %d -> %d, %v", from, to, err)
	}
	// A second init on the current schema writes nothing: the schema row
	// keeps its migrated_at and the transaction that wrote it (xmin).
	var at1, xmin1, at2, xmin2 int
	stamp := `SELECT ` + micros("migrated_at") + ` FROM agent_wrap_schema`
	xmin := `SELECT xmin::text::bigint FROM agent_wrap_schema`
	if err := queryInt(ctx, db, stamp, &at1); err != nil || at1 == 0 {
		t.Fatalf("migrated_at after init: %d, %v", at1, err)
	}
	if err := queryInt(ctx, db, xmin, &xmin1); err != nil {
		t.Fatal(err)
	}
	if from, to, err := in.Init(ctx); err != nil || from != SchemaVersion || to != SchemaVersion {
		t.Fatalf("second init: %d -> %d, %v", from, to, err)
	}
	queryInt(ctx, db, stamp, &at2)
	queryInt(ctx, db, xmin, &xmin2)
	if at2 != at1 || xmin2 != xmin1 {
		t.Errorf("a second init on the current schema wrote: migrated_at %d -> %d, xmin %d -> %d", at1, at2, xmin1, xmin2)
	}
	// A newer schema: refused by init and by use.
	if err := pg.Exec(ctx, db, `UPDATE agent_wrap_schema SET version = 99`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := in.Init(ctx); !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "99") {
		t.Errorf("init over a newer schema: %v, want ErrSchema naming 99", err)
	}
	if _, err := OpenPostgres(ctx, pg.URL("postgres", db), false); !errors.Is(err, ErrSchema) {
		t.Errorf("open a newer schema: %v, want ErrSchema", err)
	}
	var v, runs int
	queryInt(ctx, db, `SELECT version FROM agent_wrap_schema`, &v)
	queryInt(ctx, db, `SELECT count(*) FROM agent_wrap_runs`, &runs)
	if v != 99 || runs != 0 {
		t.Errorf("after the refusals: version %d, %d runs; want 99 and none", v, runs)
	}
}

func queryInt(ctx context.Context, db, sql string, out *int) error {
	p, err := OpenPostgresForInit(ctx, pg.URL("postgres", db))
	if err != nil {
		return err
	}
	defer p.Close()
	return p.with(ctx, "test query", func(c *pgconn.PgConn) error {
		res, err := query(ctx, c, sql)
		if err != nil {
			return err
		}
		*out, err = atoi(res.Rows[0][0])
		return err
	})
}
