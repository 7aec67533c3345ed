//go:build linux

package cli

import (
	"os"
	"slices"
	"testing"
)

// The --detach supervisor starts with GOMAXPROCS=1 and the caller's own
// saved beside it; put back, the job's environment is the caller's, each
// variable in its place.
func TestOneProcessorRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env, want []string
		restored  string // GOMAXPROCS after restoreGOMAXPROCS; "" unset
	}{
		{"unset", []string{"A=1", "B=2"}, []string{"A=1", "B=2", "GOMAXPROCS=1", envSavedGOMAXPROCS + "=-"}, ""},
		{"set", []string{"A=1", "GOMAXPROCS=3", "B=2"}, []string{"A=1", "GOMAXPROCS=1", "B=2", envSavedGOMAXPROCS + "=+3"}, "3"},
		{"set/empty", []string{"GOMAXPROCS="}, []string{"GOMAXPROCS=1", envSavedGOMAXPROCS + "=+"}, ""},
		{"saved/stale", []string{envSavedGOMAXPROCS + "=+9", "A=1"}, []string{"A=1", "GOMAXPROCS=1", envSavedGOMAXPROCS + "=-"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := oneProcessor(tc.env)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("oneProcessor(%q) = %q, want %q", tc.env, got, tc.want)
			}
			t.Setenv("GOMAXPROCS", "1")
			t.Setenv(envSavedGOMAXPROCS, got[len(got)-1][len(envSavedGOMAXPROCS)+1:])
			restoreGOMAXPROCS()
			if _, ok := os.LookupEnv(envSavedGOMAXPROCS); ok {
				t.Fatalf("%s is still set", envSavedGOMAXPROCS)
			}
			v, ok := os.LookupEnv("GOMAXPROCS")
			if tc.restored == "" && tc.name == "unset" && ok || v != tc.restored {
				t.Fatalf("GOMAXPROCS after restore = %q (set %v), want %q", v, ok, tc.restored)
			}
		})
	}
}
