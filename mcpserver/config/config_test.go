package config

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestCheckAndAllowed(t *testing.T) {
	parse := func(args ...string) (*Config, error) {
		var c Config
		fs := pflag.NewFlagSet("mcp", pflag.ContinueOnError)
		c.Define(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &c, c.Check()
	}
	c, err := parse("--allow", "build@*.ci", "--allow", "admin@db1")
	if err != nil {
		t.Fatal(err)
	}
	for dest, want := range map[string]bool{"build@x.ci": true, "build@x.ci.evil": false, "admin@db1": true, "admin@db2": false, "": false} {
		if got := c.Allowed(dest); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", dest, got, want)
		}
	}
	if c.OnExit != OnExitCancel || c.Lease >= 0 {
		t.Errorf("defaults: on-exit %q, lease %v; want cancel and unset", c.OnExit, c.Lease)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--on-exit", "later"}, "--on-exit"},
		{[]string{"--mux", "on"}, "--mux"},
		{[]string{"--allow", "["}, "--allow"},
		{[]string{"--allow", ""}, "--allow"},
		{[]string{"--lease", "soon"}, "lease"},
	} {
		if _, err := parse(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
