package cli

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Exit codes of a PostgreSQL ledger (see docs/reference.md).
const (
	ExitUnavailable = exitcode.Unavailable // EX_UNAVAILABLE: the ledger's database cannot be reached
	ExitNoPerm      = exitcode.NoPerm      // EX_NOPERM: the database refused the login or the access
)

const ledgerFlagUsage = "the ledger: a `DIR`, or a postgres:// URL (default $AGENT_WRAP_LEDGER, else $XDG_STATE_HOME/agent-wrap/ledger, else ~/.local/state/agent-wrap/ledger)"

// resolveLedger returns the ledger --ledger, $AGENT_WRAP_LEDGER or the
// default names, or prints why not and returns the exit code.
func (e *Env) resolveLedger(flag string) (string, int) {
	where, err := ledger.Resolve(flag, e.Getenv)
	if errors.Is(err, ledger.ErrBadURL) {
		return "", e.ledgerError(err)
	}
	if err != nil {
		e.errorf("%v", err)
		e.hint("pass --ledger DIR or set AGENT_WRAP_LEDGER")
		return "", ExitUsage
	}
	return where, 0
}

// openLedger opens the ledger for a short command (ledger, settle): a
// database is connected to at once. Errors are printed; the second result is the
// exit code to return.
func (e *Env) openLedger(flag string, create bool) (ledger.Store, int) {
	return e.openLedgerWith(flag, func(where string) (ledger.Store, error) { return ledger.Open(e.Ctx, where, create) })
}

// openControllerLedger opens the ledger for `ssh`: a directory is made if
// missing; a database is connected to at the first write (and again after
// the connection breaks), so that one away at the start is retried.
func (e *Env) openControllerLedger(flag string) (ledger.Store, int) {
	return e.openLedgerWith(flag, func(where string) (ledger.Store, error) { return ledger.OpenForController(e.Ctx, where) })
}

// openLedgerWith resolves the ledger and opens it with open; errors are
// printed, the second result is the exit code to return.
func (e *Env) openLedgerWith(flag string, open func(where string) (ledger.Store, error)) (ledger.Store, int) {
	where, code := e.resolveLedger(flag)
	if code != 0 {
		return nil, code
	}
	l, err := open(where)
	if err != nil {
		return nil, e.ledgerError(err)
	}
	return l, 0
}

// ledgerError prints a ledger's refusal with its hint and returns its exit
// code. The messages carry the URL without its password (ledger.Redact).
func (e *Env) ledgerError(err error) int {
	e.errorf("%v", err)
	return e.ledgerHint(err)
}

// ledgerHint is ledgerError once the error itself was said.
func (e *Env) ledgerHint(err error) int {
	switch {
	case errors.Is(err, rundir.ErrUnsafe):
		e.hint("the ledger must be a real directory owned by you with mode 0700; fix it or choose another with --ledger")
		return ExitUnsafeRoot
	case errors.Is(err, os.ErrNotExist):
		e.hint("no run was ever started with this ledger; pass the --ledger the runs used")
		return ExitNoRun
	case errors.Is(err, ledger.ErrBadURL):
		e.hint("a ledger URL is postgres://USER@HOST[:PORT]/DATABASE[?sslmode=...] (the password from PGPASSWORD or PGPASSFILE); see docs/controller.md")
		return ExitUsage
	case errors.Is(err, ledger.ErrDenied):
		e.hint("check the user and its password (PGPASSWORD, PGPASSFILE), pg_hba.conf, and the grants on the ledger's tables (docs/controller.md)")
		return ExitNoPerm
	case errors.Is(err, ledger.ErrUnreachable):
		e.hint("is the database up, and are the URL's host and port right? nothing was changed")
		return ExitUnavailable
	case errors.Is(err, ledger.ErrNoDatabase):
		var nd *ledger.NoDatabaseError
		if errors.As(err, &nd) {
			e.hint("create the database first, as a role that may (nothing creates one silently): %s", shellLine(nd.Createdb))
			e.hint("then make the ledger in it: agent-wrap ledger init --ledger %s", shellLine([]string{nd.Where}))
		}
		return ExitUnsafeRoot
	case errors.Is(err, ledger.ErrNoSchema):
		e.hint("run 'agent-wrap ledger init' with this --ledger once, as a role that may create tables in the database; agent-wrap creates none silently")
		return ExitUnsafeRoot
	case errors.Is(err, ledger.ErrSchema):
		e.hint("a newer agent-wrap made this ledger: run that version; an older schema is migrated by 'agent-wrap ledger init'")
		return ExitUnsafeRoot
	}
	return ExitFailure
}

// sshLogDir is where ssh's -E logs of a run go (controller.Config.LogDir):
// beside the records in a files ledger; for a database, a local state
// directory, $XDG_STATE_HOME/agent-wrap/ssh-logs, else
// ~/.local/state/agent-wrap/ssh-logs (made 0700), else the temporary
// directory.
func (e *Env) sshLogDir(l ledger.Store) string {
	if f, ok := l.(*ledger.Ledger); ok {
		return f.Path
	}
	base := e.Getenv("XDG_STATE_HOME")
	if base == "" && e.Getenv("HOME") != "" {
		base = filepath.Join(e.Getenv("HOME"), ".local", "state")
	}
	if base == "" {
		return os.TempDir()
	}
	dir := filepath.Join(base, "agent-wrap", "ssh-logs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return os.TempDir()
	}
	return dir
}

// deadFilter keeps the records whose owner is gone (ledger.OwnerGone, on
// this machine's clock), when dead is set.
func deadFilter(recs []*ledger.Record, dead bool) []*ledger.Record {
	if !dead {
		return recs
	}
	var out []*ledger.Record
	for _, r := range recs {
		if controller.OwnerGone(r) {
			out = append(out, r)
		}
	}
	return out
}
