//go:build linux

package cli_test

import (
	"context"
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/agent-wrap/agent-wrap/cli"
)

// TestMain lets the test binary act as the agent-wrap command inside scripts:
// testscript re-executes it, so every `exec agent-wrap` is a real process.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"agent-wrap": func() {
			os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
		},
	})
}

// TestScripts runs the CLI scripts in testdata/script, one feature per file,
// named category first (run_, lease_, cancel_, reconcile_, ...).
func TestScripts(t *testing.T) {
	testscript.Run(t, scriptParams())
}
