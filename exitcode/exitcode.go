// Package exitcode is agent-wrap's one table of exit codes: each code's
// number, name, meaning and the commands that give it. cli, wrapper,
// reconcile, statusfile and controller name their codes from here;
// docs/reference.md ("Exit codes") and the man page are checked against
// Table by tests, and the controller's rule for which codes of an attach
// need confirming (Confirm) is read from it.
package exitcode

import (
	"strconv"
	"strings"
	"sync"
)

// The codes by name. A run's own outcome (the job's code, 128+N, ...) is
// returned as is; these are the numbers agent-wrap chooses.
const (
	OK      = 0
	Failure = 1 // the command's own failure or refusal
	Running = 3 // reconcile: some run is still running
	Unknown = 4 // reconcile: some outcome is unknown; logs -f: it can never end

	Usage       = 64 // EX_USAGE
	NoInput     = 66 // EX_NOINPUT: no such run, or a --http secret or CA file unusable
	Unavailable = 69 // EX_UNAVAILABLE: the ledger's database cannot be reached
	Software    = 70 // EX_SOFTWARE: a launch failure other than 126/127
	TempFail    = 75 // EX_TEMPFAIL: the ID is live or its outcome unknown
	NoPerm      = 77 // EX_NOPERM: the database refused the login or the access
	Config      = 78 // EX_CONFIG: unsafe run root, run directory or ledger

	Lease         = 124 // the lease expired
	Cannot        = 125 // agent-wrap failed before the job could start
	NotExecutable = 126 // the command is not executable
	NotFound      = 127 // the command (or, over ssh, agent-wrap) was not found
	SignalBase    = 128 // 128+N: the leader died of signal N
	Lost          = 255 // ssh's own failure; agent-wrap ssh: outcome not learned

	HUP  = SignalBase + 1  // cancelled by HUP
	INT  = SignalBase + 2  // cancelled by INT
	TERM = SignalBase + 15 // cancelled by TERM or the cancel command
)

// Signal is the code of a leader that died of signal n: 128+n.
func Signal(n int) int { return SignalBase + n }

// Row is one row of the table: the codes as docs/reference.md writes them
// ("124", "126 / 127", "0-123", "128+N"), the commands that give them, and
// what they mean.
type Row struct {
	Codes   string
	From    string
	Meaning string
	// Confirm: agent-wrap itself or a cancel gives the code, so an attach
	// that ends with it does not by itself say the run completed with it:
	// the controller confirms before it settles.
	Confirm bool
}

// Table is the host's exit codes, row for row docs/reference.md's "Exit
// codes" table (a test holds them together).
var Table = []Row{
	{"0-123", "run, wait", "the job's own exit code", false},
	{"124", "run, wait", "the lease expired (cause lease)", true},
	{"125", "run", "agent-wrap itself failed before the job could start; on a system that is not Linux, every host command", true},
	{"126 / 127", "run, wait", "the command is not executable / not found (launch_failed)", true},
	{"128+N", "run, wait", "the leader died of signal N", false},
	{"143 / 130 / 129", "run, wait", "cancelled by TERM or the cancel command / INT / HUP", true},
	{"70", "run, wait", "another launch failure (the PGID could not be verified)", true},
	{"75", "run", "the ID is taken by a live run or one whose outcome is unknown", true},
	{"75", "wait", "--timeout passed, or the outcome is unknown", true},
	{"1", "renew, cancel, verify, gc, install, deploy, status, authorize", "refused, not confirmed, broken, or failed", true},
	{"3 / 4", "reconcile", "some run is running / some outcome is unknown", false},
	{"4", "logs -f", "the run can never end by itself", false},
	{"64", "every command", "usage error (nothing was claimed)", true},
	{"66", "every command naming a run", "no such run (or no run root at all)", true},
	{"66", "`run`, `ssh` with `--http-secret` or `--http-ca`", "a gateway's secret or CA file is missing, unreadable, readable by group or others, or empty", true},
	{"78", "every command", "unsafe run root or run directory", true},
	{"69", "ledger, settle (a PostgreSQL ledger)", "the ledger's database cannot be reached", false},
	{"77", "ssh, ledger, settle (a PostgreSQL ledger)", "the database refused the login or the access", false},
	{"78", "ssh, ledger, settle", "no ledger in the database, or a schema newer or older than this agent-wrap's", true},
}

// SSH is the codes `agent-wrap ssh` gives of its own, beside the run's.
var SSH = []Row{
	{"143", "ssh", "cancelled before the launch reached the host", true},
	{"255", "ssh", "the outcome could not be learned, or the first connection failed for good", false},
	{"64", "ssh", "a flag of agent-wrap ssh after DEST with no -- before it", true},
}

// Numbers lists the codes a row names: each of "a / b", a range "a-b",
// and "128+N" as 129 to 254 (255 is ssh's).
func (r Row) Numbers() []int {
	var out []int
	for _, part := range strings.Split(r.Codes, "/") {
		part = strings.TrimSpace(part)
		if part == "128+N" {
			for n := SignalBase + 1; n < Lost; n++ {
				out = append(out, n)
			}
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			panic("exitcode: bad code " + strconv.Quote(r.Codes))
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				panic("exitcode: bad code " + strconv.Quote(r.Codes))
			}
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out
}

// confirm is the set of codes a Confirm row of Table names, made on first
// use (only the controller asks).
var confirm = sync.OnceValue(func() map[int]bool {
	m := map[int]bool{}
	for _, r := range Table {
		if r.Confirm {
			for _, n := range r.Numbers() {
				m[n] = true
			}
		}
	}
	return m
})

// Confirm reports whether an attach that ends with code needs confirming
// before the controller settles the run as completed with it: agent-wrap
// itself or a cancel gives that code (a Confirm row of Table), or it is no
// exit code at all.
func Confirm(code int) bool {
	return code < 0 || code > 255 || confirm()[code]
}
