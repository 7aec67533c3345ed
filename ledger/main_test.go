package ledger

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/pgtest"
)

// pg is the test binary's PostgreSQL, one for every test here.
var pg *pgtest.Server

func TestMain(m *testing.M) {
	var err error
	if pg, err = pgtest.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "ledger: the PostgreSQL backend's tests need a real server: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop()
	os.Exit(code)
}

// backends are the two Stores every test below runs on.
var backends = []struct {
	name string
	open func(t *testing.T) Store
}{
	{"files", func(t *testing.T) Store { return open(t) }},
	{"postgres", func(t *testing.T) Store { return openPG(t) }},
}

func open(t *testing.T) *Ledger {
	t.Helper()
	l, err := OpenFiles(filepath.Join(t.TempDir(), "ledger"), true)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// pgURL makes a fresh database with the ledger's schema.
func pgURL(t *testing.T, initialise bool) string {
	t.Helper()
	ctx := context.Background()
	db, err := pg.NewDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	url := pg.URL("postgres", db)
	if initialise {
		p, err := OpenPostgresForInit(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, _, err := p.Init(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return url
}

func openPG(t *testing.T) *Postgres {
	t.Helper()
	p, err := OpenPostgres(context.Background(), pgURL(t, true), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// eachBackend runs f on both backends, in parallel.
func eachBackend(t *testing.T, f func(t *testing.T, l Store)) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.open(t))
		})
	}
}
