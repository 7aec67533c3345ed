package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/agent-wrap/agent-wrap/ledger"
	"github.com/agent-wrap/agent-wrap/proc"
)

// The controller's side of the ledger's ownership rules: who this process
// is (Self), the launching record that must commit before any connection
// (createLaunching), the ordered, retried writes of a run's later states
// (writer), and the heartbeat of every run this process drives (one write
// per tick for all of them).

var (
	selfOnce sync.Once
	self     *ledger.Owner
)

// Self is this controller process as the ledger names its owner: host name
// ($AGENT_WRAP_CONTROLLER_HOST, else the system's), boot ID, PID and start
// time. The host name is the fleet-wide part: where machines do not have
// unique names (pods of one name on different nodes, say), set the
// variable to one that is.
func Self() *ledger.Owner {
	selfOnce.Do(func() {
		host := os.Getenv("AGENT_WRAP_CONTROLLER_HOST")
		if host == "" {
			host, _ = os.Hostname()
		}
		o := &ledger.Owner{Host: host, PID: os.Getpid()}
		o.BootID = localBootID()
		if st, err := proc.ReadStat(o.PID); err == nil {
			o.Start = st.Start
		}
		self = o
	})
	return self
}

// ledgerTimeout bounds one ledger call; a call that takes longer counts as
// a database away and is retried.
const ledgerTimeout = 15 * time.Second

// createLaunching writes the run's first record. A ledger that cannot be
// reached (ledger.ErrUnreachable) is retried with backoff, said once, for
// up to --give-up: nothing is launched before the record commits. Any other
// error is returned at once.
func createLaunching(cfg *Config, rec *ledger.Record) error {
	start := time.Now()
	b := backoff{}
	retried := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), ledgerTimeout)
		err := cfg.Ledger.Create(ctx, rec)
		cancel()
		if err == nil {
			if retried {
				cfg.Notice(fmt.Sprintf("run %s: the ledger took its launching record; launching", rec.RunID))
			}
			return nil
		}
		if retried && errors.Is(err, ledger.ErrExists) && isOurs(cfg.Ledger, rec) {
			return nil // a try whose answer was lost had committed
		}
		if !errors.Is(err, ledger.ErrUnreachable) {
			return err
		}
		if time.Since(start) > cfg.GiveUp {
			return fmt.Errorf("run %s was not launched: its launching record could not be written for %v (--give-up): %w", rec.RunID, cfg.GiveUp, err)
		}
		if !retried {
			cfg.Notice(fmt.Sprintf("run %s: cannot write its launching record (%v); not launching until it commits; retrying", rec.RunID, err))
			retried = true
		}
		b.wait(context.Background())
	}
}

// isOurs reports whether the ledger's record of rec's ID is rec's own
// (same owner, same creation time): a Create that committed though its
// answer was lost.
func isOurs(l ledger.Store, rec *ledger.Record) bool {
	ctx, cancel := context.WithTimeout(context.Background(), ledgerTimeout)
	defer cancel()
	cur, err := l.Read(ctx, rec.RunID)
	return err == nil && cur.Controller != nil && rec.Controller != nil &&
		*cur.Controller == *rec.Controller && cur.CreatedAt.Equal(rec.CreatedAt)
}

// writer writes one run's records to the ledger in the order they were
// made. While the ledger answers, update waits for its write (durable
// before the controller acts on it). While it does not, the writes queue
// and are retried with backoff, in order, and update returns at once: the
// run goes on, the host deciding by its lease. A write the ledger refuses
// as ErrLost (someone else settled the run), or a ledger away for longer
// than --give-up, ends the run's following: fatal is closed and err says
// why.
type writer struct {
	store  ledger.Store
	id     string
	giveUp time.Duration
	notice func(string)

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []ledger.Record
	made    uint64    // records enqueued
	written uint64    // records written
	failing time.Time // since when the head write fails; zero: it does not
	closed  bool
	err     error
	fatal   chan struct{}
}

func newWriter(store ledger.Store, id string, giveUp time.Duration, notice func(string)) *writer {
	w := &writer{store: store, id: id, giveUp: giveUp, notice: notice, fatal: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	go w.loop()
	return w
}

// enqueue queues a copy of rec and returns its number. The caller holds
// the run's lock, so the queue's order is the records' order.
func (w *writer) enqueue(rec ledger.Record) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.made
	}
	w.queue = append(w.queue, rec)
	w.made++
	w.cond.Broadcast()
	return w.made
}

// wait waits until record n is written, or the ledger is failing, or the
// writer has ended.
func (w *writer) wait(n uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.written < n && w.failing.IsZero() && w.err == nil {
		w.cond.Wait()
	}
}

// finish waits until every queued record is written (however long the
// ledger is away, up to --give-up) and ends the writer. It returns why the
// writes could not all land, or nil.
func (w *writer) finish() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.cond.Broadcast()
	for w.written < w.made && w.err == nil {
		w.cond.Wait()
	}
	return w.err
}

func (w *writer) loop() {
	b := backoff{}
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.closed {
			w.cond.Wait()
		}
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		rec := w.queue[0]
		w.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), ledgerTimeout)
		err := w.store.Update(ctx, &rec)
		cancel()

		w.mu.Lock()
		switch {
		case err == nil:
			w.queue = w.queue[1:]
			w.written++
			if !w.failing.IsZero() {
				w.notice(fmt.Sprintf("run %s: the ledger is back; the writes it missed are landing in order", w.id))
				w.failing = time.Time{}
			}
			b.reset()
		case errors.Is(err, ledger.ErrLost):
			w.err = fmt.Errorf("%v; this controller does not overwrite it", err) // err names the run
		default:
			if w.failing.IsZero() {
				w.failing = time.Now()
				w.notice(fmt.Sprintf("run %s: cannot write to the ledger (%v); the run goes on, and the write is retried", w.id, err))
			} else if time.Since(w.failing) > w.giveUp {
				w.err = fmt.Errorf("run %s: the ledger could not be written for %v (--give-up): %v; its last states are not recorded", w.id, w.giveUp, err)
			}
		}
		fatal := w.err != nil
		if fatal {
			w.queue = nil
			close(w.fatal)
		}
		w.cond.Broadcast()
		w.mu.Unlock()
		if fatal {
			return
		}
		if err != nil {
			b.wait(context.Background())
		}
	}
}

// heartbeats renews heartbeat_at for every run this process drives: one
// Heartbeat per ledger per tick, the tick the shortest of the runs'
// renewal intervals and a third of their give-up times.
var heartbeats struct {
	mu   sync.Mutex
	runs map[*Run]struct{}
	on   bool
}

func (r *Run) startHeartbeat() {
	heartbeats.mu.Lock()
	defer heartbeats.mu.Unlock()
	if heartbeats.runs == nil {
		heartbeats.runs = map[*Run]struct{}{}
	}
	heartbeats.runs[r] = struct{}{}
	if !heartbeats.on {
		heartbeats.on = true
		go heartbeatLoop()
	}
}

func (r *Run) stopHeartbeat() {
	heartbeats.mu.Lock()
	defer heartbeats.mu.Unlock()
	delete(heartbeats.runs, r)
}

func heartbeatLoop() {
	for {
		heartbeats.mu.Lock()
		if len(heartbeats.runs) == 0 {
			heartbeats.on = false
			heartbeats.mu.Unlock()
			return
		}
		every := time.Duration(0)
		byStore := map[ledger.Store][]string{}
		for r := range heartbeats.runs {
			d := r.cfg.GiveUp / 3
			if r.cfg.RenewEvery > 0 && r.cfg.RenewEvery < d {
				d = r.cfg.RenewEvery
			}
			if every == 0 || d < every {
				every = d
			}
			byStore[r.cfg.Ledger] = append(byStore[r.cfg.Ledger], r.cfg.ID)
		}
		heartbeats.mu.Unlock()
		time.Sleep(every)
		for s, ids := range byStore {
			ctx, cancel := context.WithTimeout(context.Background(), ledgerTimeout)
			// A failure is the writer's to say: the next tick tries again.
			_ = s.Heartbeat(ctx, Self(), ids)
			cancel()
		}
	}
}

// OwnerGone reports whether rec's owner no longer drives it, as this
// process judges it now (ledger.OwnerGone with this machine's process
// table and clock). Settle judges again under its claim, on the ledger's
// clock.
func OwnerGone(rec *ledger.Record) bool {
	return ledger.OwnerGone(rec, Self(), time.Now(), proc.Alive)
}
