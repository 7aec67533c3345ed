package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agent-wrap/agent-wrap/ledger"
)

func init() {
	register(&command{
		name:     "ledger",
		summary:  "list the runs agent-wrap ssh started, unsettled first",
		synopsis: "ledger [--json] [--controller HOST[:PID]] [--dead] [--ledger DIR|URL] | ledger init [--ledger DIR|URL]\n       agent-wrap [--root DIR] " + ledgerShowSynopsis + "\n       agent-wrap " + ledgerForgetSynopsis,
		help:     ledgerHelp,
		exits:    "0; 64 bad ledger URL; 69 the database cannot be reached; 77 the database refused access; 78 unsafe ledger, no ledger in the database (run 'ledger init') or a newer schema",
		run:      runLedger,
	})
}

const ledgerHelp = `ledger lists the runs 'agent-wrap ssh' started, unsettled first, newest first:
ID, destination, state, outcome, exit code, age. --controller keeps the runs
of one controller (HOST, or HOST:PID), --dead those whose controller is gone
(its heartbeat older than the run's give-up time, wherever it runs, so a
stopped controller too; or its process ended, on this machine).

'ledger init' makes the ledger: for a postgres:// URL it creates the schema
in the database (or migrates an older one), refusing a newer one; for a
directory it makes the directory.

'ledger show RUN_ID' shows one of them with its host's timeline. 'ledger
forget RUN_ID' retires one that never launched (see its --help). See
docs/controller.md.
`

func runLedger(e *Env, args []string) int {
	if len(args) > 0 && args[0] == "show" {
		return runLedgerShow(e, args[1:])
	}
	if len(args) > 0 && args[0] == "forget" {
		return runLedgerForget(e, args[1:])
	}
	fs := e.flags("ledger")
	asJSON := fs.Bool("json", false, "one JSON object per line per run: the ledger record")
	ctl := fs.String("controller", "", "only the runs of controller `HOST[:PID]`")
	dead := fs.Bool("dead", false, "only the runs whose controller is gone")
	ledgerDir := fs.String("ledger", "", ledgerFlagUsage)
	fs.SetInterspersed(true)
	_ = fs.MarkHidden("root")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() == 1 && fs.Arg(0) == "init" {
		return e.ledgerInit(*ledgerDir)
	}
	if fs.NArg() != 0 {
		return e.ledgerSubcommandError(args, fs.Args())
	}
	l, code := e.openLedger(*ledgerDir, false)
	if l == nil {
		if code == ExitNoRun {
			return ExitOK // no ledger yet: no runs
		}
		return code
	}
	defer l.Close()
	recs, err := l.List(e.Ctx, ledger.Filter{Controller: *ctl})
	if err != nil {
		e.errorf("%v", err)
		if recs == nil {
			return e.ledgerError(err)
		}
	}
	recs = deadFilter(recs, *dead)
	// Unsettled first, then newest first.
	sort.SliceStable(recs, func(i, j int) bool {
		si, sj := recs[i].State == ledger.Settled, recs[j].State == ledger.Settled
		if si != sj {
			return !si
		}
		return recs[i].CreatedAt.After(recs[j].CreatedAt)
	})
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		enc.SetEscapeHTML(false)
		for _, r := range recs {
			enc.Encode(r)
		}
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN_ID\tDEST\tSTATE\tOUTCOME\tEXIT\tAGE")
	for _, r := range recs {
		exit := "-"
		if r.ExitCode != nil {
			exit = fmt.Sprint(*r.ExitCode)
		}
		outcome := r.Outcome
		if outcome == "" {
			outcome = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.Dest, r.State, outcome, exit, time.Since(r.CreatedAt).Truncate(time.Second))
	}
	tw.Flush()
	return ExitOK
}

// ledgerSubcommands are the words that may follow 'ledger'.
var ledgerSubcommands = []string{"forget", "init", "show"}

// ledgerSubcommandError refuses the words left after ledger's flags (rest,
// of the whole line args): a slip of a subcommand gets a did-you-mean and
// the line corrected; 'init' with more words says what init takes.
func (e *Env) ledgerSubcommandError(args, rest []string) int {
	word := rest[0]
	if word == "init" {
		e.errorf("ledger init takes no arguments, only --ledger DIR|URL (got %s)", shellLine(rest[1:]))
		e.hint("agent-wrap ledger init --ledger DIR|URL")
		return ExitUsage
	}
	near := nearWords(word, ledgerSubcommands)
	if len(near) == 0 {
		e.errorf("%q is not a subcommand of ledger, which lists runs with no argument; its subcommands are %s", word, strings.Join(ledgerSubcommands[:len(ledgerSubcommands)-1], ", ")+" and "+ledgerSubcommands[len(ledgerSubcommands)-1])
		e.hint("see 'agent-wrap ledger --help'")
		return ExitUsage
	}
	e.errorf("%q is not a subcommand of ledger; did you mean %s?", word, orList(near))
	var lines []string
	for _, n := range near {
		fixed := slices.Clone(args)
		fixed[slices.Index(fixed, word)] = n
		if n == "show" || n == "forget" {
			// show and forget are recognised only first: move it there.
			i := slices.Index(fixed, n)
			fixed = slices.Concat([]string{n}, slices.Delete(fixed, i, i+1))
		}
		lines = append(lines, shellLine(slices.Concat([]string{"agent-wrap", "ledger"}, fixed)))
	}
	e.hint("did you mean: %s", strings.Join(lines, " or "))
	return ExitUsage
}

// ledgerInit is 'ledger init': the schema of a database ledger, created
// or migrated; a directory ledger made.
func (e *Env) ledgerInit(flag string) int {
	where, code := e.resolveLedger(flag)
	if code != 0 {
		return code
	}
	if !ledger.IsURL(where) {
		if _, err := ledger.OpenFiles(where, true); err != nil {
			return e.ledgerError(err)
		}
		fmt.Fprintf(e.Stdout, "%s: a files ledger (nothing more to set up)\n", where)
		return ExitOK
	}
	p, err := ledger.OpenPostgresForInit(e.Ctx, where)
	if err != nil {
		return e.ledgerError(err)
	}
	defer p.Close()
	from, to, err := p.Init(e.Ctx)
	if err != nil {
		return e.ledgerError(err)
	}
	switch {
	case from < 0:
		fmt.Fprintf(e.Stdout, "%s: ledger created, schema version %d\n", p, to)
	case from == to:
		fmt.Fprintf(e.Stdout, "%s: ledger at schema version %d already; nothing changed\n", p, to)
	default:
		fmt.Fprintf(e.Stdout, "%s: ledger migrated from schema version %d to %d\n", p, from, to)
	}
	return ExitOK
}
