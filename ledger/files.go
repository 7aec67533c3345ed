package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/flock"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Ledger is the files backend: an opened, checked ledger directory.
//
//   - Create and Update return only once the record is on disk: the record
//     is written to a temporary file in the ledger directory, fsynced, put
//     in place (Create: link(2), which fails if the name exists, so the ID
//     is claimed atomically; Update: a renameio pending file's rename), and
//     the directory is fsynced.
//   - Files are created 0600 and read without following symlinks; a record
//     that is a symlink or someone else's is refused with rundir.ErrUnsafe.
//   - An owner's Update, a Heartbeat and a Claim of one run exclude each
//     other through an flock(2) on .RUN_ID.lock, removed again by whoever
//     held it (a waiter that finds its lock file replaced takes the new
//     one), so the ledger holds no lock files between writes.
type Ledger struct {
	Path string
}

// OpenFiles checks the ledger directory at path with the run root's rules
// (rundir.OpenRoot), creating it (mode 0700) when create is set. A missing
// ledger without create is an error wrapping os.ErrNotExist; an unsafe one
// wraps rundir.ErrUnsafe.
func OpenFiles(path string, create bool) (*Ledger, error) {
	r, err := rundir.OpenDir("ledger", path, create)
	if err != nil {
		return nil, err
	}
	r.Close()
	return &Ledger{Path: path}, nil
}

// String is the ledger's directory.
func (l *Ledger) String() string { return l.Path }

// Close does nothing: the files backend holds nothing open.
func (l *Ledger) Close() error { return nil }

func (l *Ledger) path(id string) string { return filepath.Join(l.Path, id+".json") }

// Create writes the first record of a run, durably, and fails with
// ErrExists if the ledger already holds its ID.
func (l *Ledger) Create(_ context.Context, r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	r.Schema = 1
	r.UpdatedAt = time.Now().UTC()
	if r.Controller != nil {
		r.HeartbeatAt = r.UpdatedAt
	}
	tmp, err := l.writeTemp(r)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, l.path(r.RunID)); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("run %s: %w (%s)", r.RunID, ErrExists, l.path(r.RunID))
		}
		return err
	}
	if err := os.Remove(tmp); err != nil {
		return err
	}
	return l.syncDir()
}

// Update replaces the run's record as its owner, under the run's lock:
// ErrLost, writing nothing, when the record on disk is settled;
// ErrNoRecord when there is none.
func (l *Ledger) Update(_ context.Context, r *Record) error {
	if err := rundir.ValidID(r.RunID); err != nil {
		return err
	}
	unlock, err := l.lock(r.RunID, true)
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := l.Read(context.Background(), r.RunID)
	if err != nil {
		return err
	}
	if cur.State == Settled {
		return fmt.Errorf("run %s: %w (%s)", r.RunID, ErrLost, settledWhen(cur))
	}
	r.UpdatedAt = time.Now().UTC()
	if r.Controller != nil && r.State != Settled {
		r.HeartbeatAt = r.UpdatedAt // the owner's write says it drives the run
	}
	return l.write(r)
}

// settledWhen says who settled cur, and when, for ErrLost's message.
func settledWhen(cur *Record) string {
	by := "its owner"
	if cur.SettledBy != nil {
		by = cur.SettledBy.String()
	}
	return fmt.Sprintf("settled %s by %s at %s", cur.Outcome, by, cur.SettledAt.Format(time.RFC3339))
}

// write puts r in place: a renameio pending file in the ledger directory,
// fsynced, renamed over the record, then the directory fsynced.
func (l *Ledger) write(r *Record) error {
	if err := l.checkFile(r.RunID); err != nil && !errors.Is(err, ErrNoRecord) {
		return err
	}
	r.Schema = 1
	b, err := marshal(r)
	if err != nil {
		return err
	}
	t, err := renameio.NewPendingFile(l.path(r.RunID), renameio.WithTempDir(l.Path), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return err
	}
	defer t.Cleanup()
	if _, err := t.Write(b); err != nil {
		return err
	}
	if err := t.CloseAtomicallyReplace(); err != nil {
		return err
	}
	return l.syncDir()
}

// Heartbeat rewrites heartbeat_at in each record of ids that o drives and
// that is not settled (a record each: the files backend has no one write
// for many).
func (l *Ledger) Heartbeat(_ context.Context, o *Owner, ids []string) error {
	var errs []error
	for _, id := range ids {
		if err := l.heartbeat(o, id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (l *Ledger) heartbeat(o *Owner, id string) error {
	unlock, err := l.lock(id, true)
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := l.Read(context.Background(), id)
	if err != nil {
		return err
	}
	if cur.State == Settled || cur.ControllerPID != o.PID || cur.Controller == nil || *cur.Controller != *o {
		return nil
	}
	cur.HeartbeatAt = time.Now().UTC()
	return l.write(cur)
}

// Claim takes run id for settling: its lock, without waiting (ErrBusy
// when another holds it), and the record read under it. Settle writes
// under the lock whatever the record on disk says, the claim being the
// right to.
func (l *Ledger) Claim(ctx context.Context, id string) (*Claim, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	unlock, err := l.lock(id, false)
	if err != nil {
		return nil, err
	}
	rec, err := l.Read(ctx, id)
	if err != nil {
		unlock()
		return nil, err
	}
	return &Claim{
		Record: rec, Now: time.Now().UTC(),
		settle: func(_ context.Context, r *Record) error {
			defer unlock()
			r.UpdatedAt = time.Now().UTC()
			return l.write(r)
		},
		release: unlock,
	}, nil
}

// lockMu orders this process's own holders of one lock file: flock(2)
// locks are per open file, so two goroutines would each get one.
var lockMu sync.Map // path -> *sync.Mutex

// lock takes the flock of run id's lock file, waiting or not, and returns
// its release, which removes the file before unlocking it.
func (l *Ledger) lock(id string, wait bool) (func(), error) {
	path := filepath.Join(l.Path, "."+id+".lock")
	m, _ := lockMu.LoadOrStore(path, new(sync.Mutex))
	mu := m.(*sync.Mutex)
	if wait {
		mu.Lock()
	} else if !mu.TryLock() {
		return nil, fmt.Errorf("run %s: %w", id, ErrBusy)
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			mu.Unlock()
			return nil, err
		}
		how := unix.LOCK_EX
		if !wait {
			how |= unix.LOCK_NB
		}
		if err := flock.Lock(int(f.Fd()), how); err != nil {
			f.Close()
			mu.Unlock()
			if err == unix.EWOULDBLOCK {
				return nil, fmt.Errorf("run %s: %w", id, ErrBusy)
			}
			return nil, &os.PathError{Op: "flock", Path: path, Err: err}
		}
		// The holder before us may have removed the file: then ours is
		// a lock nobody else sees. Take the one at the path now.
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Lstat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return func() {
				os.Remove(path)
				f.Close() // unlocks
				mu.Unlock()
			}, nil
		}
		f.Close()
	}
}

func marshal(r *Record) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	return append(b, '\n'), err
}

// writeTemp writes r to a new, fsynced temporary file in the ledger
// directory and returns its path.
func (l *Ledger) writeTemp(r *Record) (string, error) {
	b, err := marshal(r)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(l.Path, "."+r.RunID+".tmp*")
	if err != nil {
		return "", err
	}
	name := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

func (l *Ledger) syncDir() error {
	d, err := os.Open(l.Path)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return &os.PathError{Op: "fsync", Path: l.Path, Err: err}
	}
	return nil
}

// checkFile refuses a record file that is not a regular file of ours.
func (l *Ledger) checkFile(id string) error {
	var st unix.Stat_t
	if err := unix.Lstat(l.path(id), &st); err != nil {
		if err == unix.ENOENT {
			return fmt.Errorf("run %s: %w (%s)", id, ErrNoRecord, l.Path)
		}
		return &os.PathError{Op: "lstat", Path: l.path(id), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return fmt.Errorf("ledger record %s is not a regular file of yours, private to you: %w", l.path(id), rundir.ErrUnsafe)
	}
	return nil
}

// Read returns the run's record; ErrNoRecord if the ledger has none.
func (l *Ledger) Read(_ context.Context, id string) (*Record, error) {
	if err := rundir.ValidID(id); err != nil {
		return nil, err
	}
	if err := l.checkFile(id); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(l.path(id), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r Record
	if err := json.NewDecoder(f).Decode(&r); err != nil {
		return nil, fmt.Errorf("ledger record %s: %w", l.path(id), err)
	}
	if r.RunID != id {
		return nil, fmt.Errorf("ledger record %s names run %q", l.path(id), r.RunID)
	}
	return &r, nil
}

// IDs returns the run IDs the ledger holds, sorted.
func (l *Ledger) IDs() ([]string, error) {
	ents, err := os.ReadDir(l.Path)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && rundir.ValidID(id) == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// List returns the records f selects, sorted by run ID; one that cannot
// be read is named in the error.
func (l *Ledger) List(ctx context.Context, f Filter) ([]*Record, error) {
	ids, err := l.IDs()
	if err != nil {
		return nil, err
	}
	var recs []*Record
	var errs []error
	for _, id := range ids {
		r, err := l.Read(ctx, id)
		switch {
		case errors.Is(err, ErrNoRecord):
			// removed since the listing
		case err != nil:
			errs = append(errs, err)
		case f.match(r):
			recs = append(recs, r)
		}
	}
	return recs, errors.Join(errs...)
}
