//go:build linux

package cli

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// Every command's --help (and -h, and `help CMD`) prints to
// stdout, exits 0, and gives a synopsis, one line of purpose, the flags with
// honest defaults, and the exit codes. The commands come from the dispatch
// table, so a command added later is held to the same.
func TestHelpEveryCommand(t *testing.T) {
	badDefault := regexp.MustCompile(`\(default (-|0s\)|0\)|""|\[\]\))`)
	for _, name := range commandNames() {
		c := commands[name]
		t.Run(name, func(t *testing.T) {
			if c.summary == "" || c.synopsis == "" || c.exits == "" {
				t.Fatalf("command %q lacks summary, synopsis or exits: %+v", name, *c)
			}
			if strings.Contains(c.summary, "\n") || strings.HasSuffix(c.summary, ".") {
				t.Errorf("summary is not one line without a period: %q", c.summary)
			}
			for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
				var out, errb bytes.Buffer
				e := &Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
				code := e.Run(args)
				help := out.String()
				if code != 0 || errb.Len() != 0 {
					t.Fatalf("%v: exit %d, stderr %q; want 0 and nothing on stderr", args, code, errb.String())
				}
				for _, want := range []string{"usage: agent-wrap [--root DIR] " + c.synopsis, "\n" + c.summary + "\n", "\nflags:\n", "--root DIR", "\nexit: " + c.exits} {
					if !strings.Contains(help, want) {
						t.Errorf("%v: help lacks %q:\n%s", args, want, help)
					}
				}
				if m := badDefault.FindString(help); m != "" {
					t.Errorf("%v: help shows a default that says nothing true, %q:\n%s", args, m, help)
				}
				for _, line := range strings.Split(help, "\n") {
					if strings.Contains(line, "required") && strings.Contains(line, "(default") {
						t.Errorf("%v: a required flag with a default: %q", args, line)
					}
				}
			}
		})
	}
}

// `agent-wrap help` lists every registered command on stdout; `help NAME`
// for a name that is not one is a usage error that suggests the near one.
func TestHelpLists(t *testing.T) {
	var out, errb bytes.Buffer
	e := &Env{Stdout: &out, Stderr: &errb}
	if code := e.Run([]string{"help"}); code != 0 || errb.Len() != 0 {
		t.Fatalf("help: exit %d, stderr %q", code, errb.String())
	}
	for _, name := range commandNames() {
		if !regexp.MustCompile(`(?m)^  ` + name + ` +\S`).MatchString(out.String()) {
			t.Errorf("help does not list %q:\n%s", name, out.String())
		}
	}
	out.Reset()
	errb.Reset()
	if code := e.Run([]string{"help", "stauts"}); code != ExitUsage || !strings.Contains(errb.String(), `did you mean "status"?`) {
		t.Errorf("help stauts: exit %d, stderr %q", code, errb.String())
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"list", "list", 0}, {"lsit", "list", 1}, {"stauts", "status", 1}, {"cancle", "cancel", 1},
		{"canc", "cancel", 2}, {"lists", "list", 1}, {"lst", "list", 1}, {"gc", "g1", 1},
		{"reconcle", "reconcile", 1}, {"build-7", "list", 6}, {"", "run", 3}, {"ab", "ba", 1},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// The guard comes from the dispatch table: a command registered later
// (ssh, attach, ledger, settle, authorize, ...) is guarded with no change to
// the guard. Names under six letters allow one edit, longer ones two.
func TestNearCommandsFollowsTheTable(t *testing.T) {
	for _, name := range []string{"ledger", "attach"} {
		if _, ok := commands[name]; ok {
			continue // registered for real by now
		}
		commands[name] = &command{name: name}
		t.Cleanup(func() { delete(commands, name) })
	}
	for word, want := range map[string]string{
		"leddger": "ledger", "ledgr": "ledger", "ldger": "ledger", "atach": "attach", "attahc": "attach",
		"stauts": "status", "statsu": "status", "lsit": "list", "runn": "run", "g1": "gc",
		"job-1": "", "build7": "", "nd4": "", "deploy-job-1": "",
	} {
		near := nearCommands(word)
		got := strings.Join(near, ",")
		if want == "" && got != "" || want != "" && !strings.Contains(","+got+",", ","+want+",") {
			t.Errorf("nearCommands(%q) = %q, want %q", word, got, want)
		}
	}
}
