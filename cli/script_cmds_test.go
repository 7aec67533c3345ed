package cli_test

import (
	"github.com/rogpeppe/go-internal/testscript"
)

// scriptParams is the shared testscript setup: every script gets a private
// run root in $AGENT_WRAP_ROOT and the custom commands below.
func scriptParams() testscript.Params {
	return testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("AGENT_WRAP_ROOT", env.WorkDir+"/runs")
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){},
	}
}
