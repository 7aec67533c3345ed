package controller

import (
	"reflect"
	"testing"
	"time"
)

// The remote cancel's words: --grace only when CancelGrace asked for one
// (the first asked wins), and --json second, where cancelLoop drops it for
// a host too old to know it.
func TestCancelWords(t *testing.T) {
	r := &Run{cfg: Config{ID: "r1"}}
	if got, want := r.cancelWords(35*time.Second), []string{"cancel", "--json", "--wait", "35s", "r1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("without a grace: %q, want %q", got, want)
	}
	r.cancelGrace.CompareAndSwap(0, int64(1500*time.Millisecond))
	r.cancelGrace.CompareAndSwap(0, int64(9*time.Second)) // as a second CancelGrace would
	got := r.cancelWords(35 * time.Second)
	if want := []string{"cancel", "--json", "--wait", "35s", "--grace", "1.5s", "r1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("with a grace: %q, want %q", got, want)
	}
	if got[1] != "--json" {
		t.Errorf("--json is not second: %q", got)
	}
}
