//go:build linux

package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/lease"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// A run's files are what the contract names and no more: no
// `lock` (the run directory is the flock target), no temp file left, the
// journal intact though the wrapper kept it open; and the deadline is
// written with the first record, so whoever sees a record of a leased run
// also finds a whole deadline_epoch, never a missing or empty one.
func TestRunFilesDeadlineWithFirstRecord(t *testing.T) {
	root := runtest.NewRoot(t)
	const n = 20
	churn(t, root, "floor", n, 2, 0, []string{"--lease", "60s"}, []string{"true"}, "no whole deadline",
		func(id, dir string, _ []byte) error {
			b, err := os.ReadFile(filepath.Join(dir, "deadline_epoch"))
			if err == nil {
				_, err = lease.ParseDeadline(b)
			}
			if err != nil {
				return fmt.Errorf("%s: %v", id, err)
			}
			return nil
		})

	want := []string{"deadline_epoch", "events.jsonl", "pgid", "pid", "status.json", "stderr.log", "stdout.log"}
	for j := 0; j < n; j++ {
		r := runtest.Run{Root: root, ID: fmt.Sprintf("floor-%d", j)}
		ents, err := os.ReadDir(r.Dir())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		if strings.Join(names, " ") != strings.Join(want, " ") {
			t.Errorf("%s holds %v, want exactly %v", r.ID, names, want)
		}
		rec := r.Status()
		if rec == nil || rec.State != statusfile.Finished {
			t.Fatalf("%s: record %+v", r.ID, rec)
		}
		created, err := time.Parse(time.RFC3339Nano, rec.CreatedAt)
		if err != nil {
			t.Fatal(err)
		}
		dl, err := lease.ParseDeadline([]byte(r.File("deadline_epoch")))
		if err != nil {
			t.Fatal(err)
		}
		if lo := created.Add(60 * time.Second).Unix(); dl < lo || dl > lo+2 {
			t.Errorf("%s: deadline %d, want created_at + 60 s rounded up (%d)", r.ID, dl, lo)
		}
		if code, out, errs := aw(t, root, "verify", r.ID); code != 0 {
			t.Errorf("verify %s: exit %d\n%s%s", r.ID, code, out, errs)
		}
	}
}
