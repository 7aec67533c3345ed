package cli

import (
	"strconv"
	"strings"
)

// The short form `agent-wrap RUN_ID CMD...` has no command name, so a
// mistyped one (`agent-wrap stauts date`) would be taken as a run ID and run
// its argument as a job. nearCommands is the guard: run refuses, in the short
// form, a RUN_ID that is a command name or close to one. The names come from
// the dispatch table, so a command added later is guarded without a change
// here.

// nearCommands returns the command names that word may be a typo of: one
// edit away (an insertion, a deletion, a substitution, or a swap of two
// neighbours), or two away from a name of six letters or more, where two
// slips in one word are common and a real run ID that close is not. word
// itself counts when it is a name.
func nearCommands(word string) []string {
	return nearWords(word, commandNames())
}

// nearWords is nearCommands over other names (a command's subcommands).
func nearWords(word string, names []string) []string {
	var near []string
	for _, name := range names {
		limit := 1
		if len(name) >= 6 {
			limit = 2
		}
		if editDistance(word, name) <= limit {
			near = append(near, name)
		}
	}
	return near
}

// editDistance is the optimal string alignment distance between a and b,
// byte by byte: Levenshtein's insertions, deletions and substitutions, plus
// a swap of two adjacent bytes counted as one edit (`lsit` is one from
// `list`).
func editDistance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// orList renders names as `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
func orList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// shellLine renders argv as one POSIX shell line, each word quoted only
// where it needs to be, for hints the user may paste.
func shellLine(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@+,%") == "" {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
