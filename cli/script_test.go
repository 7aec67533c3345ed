//go:build linux

package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/agent-wrap/agent-wrap/cli"
	"github.com/agent-wrap/agent-wrap/internal/runtest"
)

// TestMain lets the test binary act as the agent-wrap command inside scripts:
// testscript re-executes it, so every `exec agent-wrap` is a real process.
// cliParallel is how many tests run at once here (runtest.MoreAtOnce): the
// process-tree tests wait on leases, graces and the processes they start.
const cliParallel = 6

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) != "agent-wrap" { // not testscript's re-run of this binary as the command
		runtest.MoreAtOnce(cliParallel)
	}
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
