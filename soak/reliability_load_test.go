package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Load: many concurrent runs, started (--detach), renewed and cancelled in
// parallel by 4 clients, each a goroutine executing the binary, as 4
// controllers would over ssh. Every run must end cancelled (cause cancel,
// no survivors) with its journal intact, and nothing of any run, job or
// wrapper, may be left alive. 60 runs in go test, 300 under make soak. The
// lease (15 minutes) outlasts the start phase even on a machine so loaded
// that 300 starts take minutes: a lease that ran out first would be
// enforced, rightly, and the renewals refused.
func TestLoad(t *testing.T) {
	const clients = 4
	n := count(60, 300)
	root := runtest.NewRoot(t)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("load-%03d", i)
		r := runtest.Run{Root: root, ID: ids[i]}
		t.Cleanup(r.Kill)
	}
	var started, renewed, cancelled atomic.Int64
	begin := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []string
			for i := c; i < n; i += clients {
				mine = append(mine, ids[i])
			}
			// step runs what for each of the client's runs, in turn,
			// counting in done those that exit 0.
			step := func(what string, done *atomic.Int64, argv func(id string) []string) {
				for _, id := range mine {
					code, _, errs := aw(t, nil, append([]string{"--root", root}, argv(id)...)...)
					if code != 0 {
						t.Errorf("client %d: %s %s: exit %d: %s", c, what, id, code, errs)
						continue
					}
					done.Add(1)
				}
			}
			step("run --detach", &started, func(id string) []string {
				return []string{"run", "--detach", "--lease", "900", "--grace", "2", id, "--", "sh", "-c", "sleep 3600 & wait"}
			})
			step("renew", &renewed, func(id string) []string { return []string{"renew", "--lease", "900", id} })
			step("cancel", &cancelled, func(id string) []string { return []string{"cancel", "--wait", "120s", id} })
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)

	var terminal, verified, survivors, wrappers int
	for _, id := range ids {
		r := runtest.Run{Root: root, ID: id}
		rec := r.Status()
		if rec == nil {
			t.Errorf("%s: no readable record", id)
			continue
		}
		if statusfile.Terminal(rec.State) {
			terminal++
		}
		if rec.State != statusfile.Cancelled || rec.Cause != statusfile.CauseCancel || len(rec.Survivors) != 0 {
			t.Errorf("%s: state %s, cause %s, survivors %v; want cancelled, cancel, none", id, rec.State, rec.Cause, rec.Survivors)
		}
		leader := proc.Identity{PID: rec.PGID, Start: rec.LeaderStart}
		if live := liveGroup(leader); len(live) > 0 {
			// KILLed members may need a moment to be zombies.
			if !runtest.Within(5*time.Second, func() bool { return len(group(leader)) == 0 }) {
				survivors += len(live)
				t.Errorf("%s: alive after a confirmed cancel: %v", id, live)
			}
		}
		if !runtest.Within(runtest.Patience, func() bool { return !membership.WrapperAlive(rec) }) {
			wrappers++
			t.Errorf("%s: wrapper %d still alive after its final record", id, rec.WrapperPID)
		}
		f, err := os.Open(filepath.Join(r.Dir(), "events.jsonl"))
		if err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		if _, err := journal.Verify(f); err != nil {
			t.Errorf("%s: journal: %v", id, err)
		} else {
			verified++
		}
		f.Close()
	}
	t.Logf("%d runs, %d clients, %v: started %d, renewed %d, cancelled (confirmed) %d, terminal %d, journals verified %d, surviving processes %d, live wrappers %d",
		n, clients, elapsed.Truncate(time.Millisecond), started.Load(), renewed.Load(), cancelled.Load(), terminal, verified, survivors, wrappers)
}
