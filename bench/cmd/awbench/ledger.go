package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/internal/pgtest"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// ledgerFigure: the PostgreSQL ledger against the files ledger,
// in one run, through a throwaway sshd (internal/sshtest), one shared
// ControlMaster, and a private PostgreSQL (internal/pgtest: its own
// cluster on a unix socket, fsync off as in the tests; a production
// database's commit adds its disk's flush):
//   - `agent-wrap ssh DEST -- true` with --ledger postgres://... against
//     the same with --ledger DIR, interleaved (target ≤ 1.2×);
//   - N concurrent `agent-wrap ssh DEST -- true` from this machine against
//     the one database (100; 20 with -quick): every run settled completed,
//     and the database's connection count for the ledger, sampled every
//     20 ms throughout, at most one per controller process (each holds one
//     connection: the bound is the number of controllers, not of writes).
func (r *runner) ledgerFigure() (err error) {
	defer catchFatal(&err)
	pg, err := pgtest.Start()
	if err != nil {
		return err
	}
	r.onCleanup(pg.Stop)
	ctx := context.Background()
	db, err := pg.NewDB(ctx)
	if err != nil {
		return err
	}
	url := pg.URL("postgres", db)
	if out, err := exec.Command(r.bin, "ledger", "init", "--ledger", url).CombinedOutput(); err != nil {
		return fmt.Errorf("ledger init: %v: %s", err, out)
	}
	g, err := r.sshRig("ledger", "lm")
	if err != nil {
		return err
	}
	files := filepath.Join(r.scratch, "ledger-files")
	ctl := func(led, id string) *exec.Cmd { return g.ctl(led, id, "true") }

	// 1. One run of `true`, each ledger.
	viaPG := func() (float64, error) { return timeCmd(ctl(url, r.id("lpg"))) }
	viaFiles := func() (float64, error) { return timeCmd(ctl(files, r.id("lfiles"))) }
	s, err := bench.Interleave(2, r.n(30, 10), viaPG, viaFiles)
	if err != nil {
		return err
	}
	a, b := bench.Median(s[0]), bench.Median(s[1])
	r.msRow("ledger: ssh run of `true`, PostgreSQL ledger", a, b, "files ledger", 1.2)
	r.detail("ledger `agent-wrap ssh DEST -- true`, --ledger postgres:// (private PostgreSQL %s, unix socket, fsync off): %s; --ledger DIR: %s (one shared ControlMaster)",
		filepath.Base(filepath.Dir(pg.BinDir)), spread(s[0], bench.Ms), spread(s[1], bench.Ms))

	// 2. N concurrent runs against the one database.
	n := r.n(100, 20)
	stopSampling := make(chan struct{})
	sampled := make(chan [2]int, 1) // max connections, samples
	go func() {
		most, samples := 0, 0
		for {
			if c, err := pg.Connections(ctx, db); err == nil {
				most, samples = max(most, c), samples+1
			}
			select {
			case <-stopSampling:
				sampled <- [2]int{most, samples}
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := bench.Now()
	for i := range n {
		ids[i] = r.id("lconc")
		cmd := ctl(url, ids[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("run %s: %v: %s", ids[i], err, out)
			}
		}()
	}
	wg.Wait()
	wall := bench.Since(t0)
	close(stopSampling)
	conns := <-sampled
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	l, err := ledger.Open(ctx, url, false)
	if err != nil {
		return err
	}
	defer l.Close()
	settled := 0
	for _, id := range ids {
		rec, err := l.Read(ctx, id)
		if err != nil {
			return err
		}
		if rec.State == ledger.Settled && rec.Outcome == ledger.Completed && rec.Code() == 0 {
			settled++
		}
	}
	ok := settled == n && conns[0] <= n
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("ledger: %d concurrent ssh runs, one database", n),
		measured: fmt.Sprintf("%d/%d settled; at most %d connections", settled, n, conns[0]),
		baseline: fmt.Sprintf("%d controller processes", n),
		ratio:    fmt.Sprintf("%.2f conn/controller", float64(conns[0])/float64(n)),
		target:   "all settled, ≤ 1 connection per controller",
		limit:    fmt.Sprintf("%.2f", float64(conns[0])/float64(n)),
		pass:     passIf(ok),
	})
	r.detail("ledger: %d concurrent `agent-wrap ssh DEST -- true` with one PostgreSQL ledger: all done in %.2f s wall; %d settled completed; the ledger database's connections (pg_stat_activity, %d samples every 20 ms; the sampler is connected to another database) at most %d",
		n, wall, settled, conns[1], conns[0])
	return nil
}
