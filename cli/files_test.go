//go:build linux

package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	var stop atomic.Bool
	var seen, bad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for j := 0; j < n; j++ {
					dir := filepath.Join(root, fmt.Sprintf("floor-%d", j))
					if _, err := os.ReadFile(filepath.Join(dir, "status.json")); err != nil {
						continue // no record yet: the run is not visible
					}
					seen.Add(1)
					b, err := os.ReadFile(filepath.Join(dir, "deadline_epoch"))
					if err == nil {
						_, err = lease.ParseDeadline(b)
					}
					if err != nil {
						bad.Add(1)
						firstBad.CompareAndSwap(nil, fmt.Sprintf("floor-%d: %v", j, err))
					}
				}
			}
		}()
	}
	var cmds []*runtest.Cmd
	for j := 0; j < n; j++ {
		id := fmt.Sprintf("floor-%d", j)
		c, _ := startRun(t, root, id, "--no-stream", "--lease", "60s", id, "--", "true")
		cmds = append(cmds, c)
	}
	for _, c := range cmds {
		if code := c.Wait(t); code != 0 {
			t.Errorf("exit %d: %s", code, c.Stderr.String())
		}
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d of %d looks at a visible run found no whole deadline; first: %v", bad.Load(), seen.Load(), firstBad.Load())
	}
	if seen.Load() < n {
		t.Fatalf("only %d looks at a visible run", seen.Load())
	}

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
