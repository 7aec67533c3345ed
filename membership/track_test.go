package membership_test

import (
	"os"
	"slices"
	"testing"

	"github.com/agent-wrap/agent-wrap/membership"
)

// A Tracker's first look (a whole one, judging only what could be the
// run's) finds what Judge over the whole table finds for the run's wrapper:
// the leader, a descendant that left the group and its child.
func TestTrackerFirstLookIsJudge(t *testing.T) {
	leader := start(t, true, "sleep", "600")
	esc := start(t, true, "sh", "-c", "sleep 600 & wait")
	grandchild := childOf(t, esc.PID)
	run := membership.Run{Record: record(t, leader), Supervisor: os.Getpid()}
	tr := membership.NewTracker(run)
	got, err := tr.Look()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := run.Judge(mustScan(t))
	if !slices.Equal(pids(got), pids(want)) {
		t.Fatalf("Tracker's first look = %v, Judge of the whole table = %v", pids(got), pids(want))
	}
	for _, p := range []int{leader.PID, esc.PID, grandchild.PID} {
		if !slices.Contains(pids(got), p) {
			t.Fatalf("Tracker's first look = %v, want %d", pids(got), p)
		}
	}
	if c := tr.Counts(); c.Whole != 1 {
		t.Fatalf("looks %+v, want one whole", c)
	}
}
