package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agent-wrap/agent-wrap/answer"
	"github.com/agent-wrap/agent-wrap/internal/flock"
)

// Renewals batched per destination: with agent-wrap's masters (mux.go),
// the runs that renew at the same moment, in this controller process or in
// any other of the user's on this machine, renew together in one session,
// `renew --json ID...` (the host renews each under that run's own lock and
// answers one JSON line per run).
//
// The runs meet in a spool directory beside the masters' sockets,
// DIR/HASH.renew (HASH naming the rsh, the destination, the remote binary
// and root: only runs renewed by the same command line are batched):
//   - A run that wants a renewal creates want/ID and holds a shared flock
//     on it while it waits: a want whose run has gone is never renewed
//     (the lease is what ends a run whose controller is gone).
//   - Whichever waiting run takes the batch lock (HASH.renew.lock) leads:
//     it lets the others of the moment arrive (gatherQuiet, at most
//     gatherMax), takes every live want, makes the one call, and writes
//     each run's answer to ans/ID. A leader that dies leaves the lock free
//     and the wants it took unanswered: a run that finds the lock free and
//     no answer puts its want back and leads.
//   - The renewals of every run fall on the same instants (multiples of
//     --renew-every since the Unix epoch, see nextTick), so the runs of one
//     tick meet.
//
// A host whose agent-wrap has no `renew --json` (it answers with no JSON
// line) is renewed run by run, as without a mux.

// gatherQuiet and gatherMax bound a leader's wait for the others of its
// tick: until no new want arrived for gatherQuiet, at most gatherMax.
const (
	gatherQuiet = 25 * time.Millisecond
	gatherMax   = 250 * time.Millisecond
)

// renewBatch is the spool of one destination's renewals.
type renewBatch struct {
	dir string // DIR/HASH.renew
	h   *Host
}

func newRenewBatch(muxDir string, h *Host) *renewBatch {
	name := hashWords(append(append([]string{}, h.rsh...), "\x00", h.dest, "\x00", h.bin, "\x00", h.root))
	return &renewBatch{dir: filepath.Join(muxDir, name+".renew"), h: h}
}

// Batched reports whether the host's renewals are batched with the other
// runs to its destination (with the masters only).
func (h *Host) Batched() bool { return h.batch != nil }

// RenewBatched renews run id with the others of its moment, within
// timeout. A BatchAnswer with Single set: the host has no batch renew,
// renew the run alone. Only where Batched.
func (h *Host) RenewBatched(ctx context.Context, id string, timeout time.Duration) BatchAnswer {
	return h.batch.renew(ctx, id, timeout)
}

// BatchAnswer is one run's answer, as the leader writes it to ans/ID:
// renew's JSON line for it (answer.Renew), or what the leader knows when
// there is none.
type BatchAnswer struct {
	answer.Renew

	Lost   string `json:"lost,omitempty"`   // the session failed as a connection: why
	Single bool   `json:"single,omitempty"` // the host has no batch renew: renew alone
	Batch  int    `json:"batch,omitempty"`  // how many runs that session renewed
}

// lostAnswer is the answer of a renewal of run id that got no host answer:
// why it was lost.
func lostAnswer(id, why string) BatchAnswer {
	return BatchAnswer{Renew: answer.Renew{RunID: id}, Lost: why}
}

// renew renews run id with the others of its moment, within timeout.
func (b *renewBatch) renew(ctx context.Context, id string, timeout time.Duration) BatchAnswer {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, d := range []string{b.dir, filepath.Join(b.dir, "want"), filepath.Join(b.dir, "ans")} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return lostAnswer(id, err.Error())
		}
	}
	want := filepath.Join(b.dir, "want", id)
	ans := filepath.Join(b.dir, "ans", id)
	os.Remove(ans) // of a renewal that gave up waiting
	w, err := b.post(want)
	if err != nil {
		return lostAnswer(id, err.Error())
	}
	defer func() { w.Close() }()
	defer os.Remove(want) // one no leader took: nobody waits for it now
	for {
		if a, ok := readAnswer(ans); ok {
			return a
		}
		unlock, err := lockFile(ctx, b.dir+".lock", syscall.LOCK_EX)
		if err != nil {
			return lostAnswer(id, "renewal batch: "+err.Error())
		}
		if a, ok := readAnswer(ans); ok {
			unlock()
			return a
		}
		// No answer and nobody leads: a leader took the want and died, or
		// it is still ours. Lead, with the want in place.
		if _, err := os.Stat(want); err != nil {
			w.Close()
			if w, err = b.post(want); err != nil {
				unlock()
				return lostAnswer(id, err.Error())
			}
		}
		b.lead(ctx)
		unlock()
		if ctx.Err() != nil {
			if a, ok := readAnswer(ans); ok {
				return a
			}
			return lostAnswer(id, "renewal batch: "+ctx.Err().Error())
		}
	}
}

// post creates the want at path and holds a shared flock on it.
func (b *renewBatch) post(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock.Lock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// lead gathers the live wants, renews them in one session and answers
// each. Called with the batch lock held.
func (b *renewBatch) lead(ctx context.Context) {
	wantDir := filepath.Join(b.dir, "want")
	n, since, start := -1, time.Now(), time.Now()
	for time.Since(start) < gatherMax && ctx.Err() == nil {
		names, _ := os.ReadDir(wantDir)
		if len(names) != n {
			n, since = len(names), time.Now()
		} else if time.Since(since) >= gatherQuiet {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	ents, _ := os.ReadDir(wantDir)
	var ids []string
	for _, e := range ents {
		p := filepath.Join(wantDir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		// An exclusive flock that succeeds: nobody waits for this one.
		err = flock.Lock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close()
		os.Remove(p)
		if err != nil {
			ids = append(ids, e.Name())
		}
	}
	if len(ids) == 0 {
		return
	}
	var out, errb bytes.Buffer
	res := b.h.Call(ctx, Call{Line: b.h.Remote(append([]string{"renew", "--json"}, ids...)...), Stdout: &out, Stderr: &errb})
	got := answer.ParseRenew(out.Bytes())
	for _, id := range ids {
		var a BatchAnswer
		r, ok := got[id]
		switch {
		case ok:
			// The spool keeps the fields renewCall reads, as it always has.
			r.State, r.Deadline = "", 0
			a = BatchAnswer{Renew: r, Batch: len(ids)}
		case res.Lost():
			a = lostAnswer(id, res.Why())
		case len(got) == 0:
			a = BatchAnswer{Renew: answer.Renew{RunID: id}, Single: true}
		default:
			a = lostAnswer(id, fmt.Sprintf("renew --json exited %d without a line for this run", res.Code))
		}
		writeAnswer(filepath.Join(b.dir, "ans", id), a)
	}
}

func writeAnswer(path string, a BatchAnswer) {
	bs, _ := json.Marshal(a)
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)) // run IDs never begin with a dot
	if os.WriteFile(tmp, bs, 0o600) == nil {
		_ = os.Rename(tmp, path)
	}
}

// readAnswer takes the answer at path, if there is one.
func readAnswer(path string) (BatchAnswer, bool) {
	bs, err := os.ReadFile(path)
	if err != nil {
		return BatchAnswer{}, false
	}
	os.Remove(path)
	var a BatchAnswer
	if json.Unmarshal(bs, &a) != nil {
		return BatchAnswer{}, false
	}
	return a, true
}

// NextTick returns how long until the next renewal instant of period every:
// the next multiple of every since the Unix epoch (the same instants in
// every controller process, so that their runs' renewals meet).
func NextTick(now time.Time, every time.Duration) time.Duration {
	d := every - time.Duration(now.UnixNano()%int64(every))
	if d <= 0 {
		d = every
	}
	return d
}
