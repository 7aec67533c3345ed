package rundir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestValidID(t *testing.T) {
	for _, id := range []string{"a", "A9", "run-1", "run_1.2", "x" + strings.Repeat("y", 127)} {
		if err := ValidID(id); err != nil {
			t.Errorf("ValidID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", "../x", "a/b", ".x", "-x", "_x", "a b", "a\n", "é", strings.Repeat("y", 129), "..", "."} {
		if err := ValidID(id); !errors.Is(err, ErrBadID) {
			t.Errorf("ValidID(%q) = %v, want ErrBadID", id, err)
		}
	}
}

func newRoot(t *testing.T) *Root {
	t.Helper()
	r, err := OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// newJob is newRoot with the run "job" created in it, closed at cleanup.
func newJob(t *testing.T) (*Root, *Dir) {
	t.Helper()
	r := newRoot(t)
	d, err := r.Create("job")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return r, d
}

func TestOpenRootRefusesUnsafe(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.Mkdir(real, 0o700)
	link := filepath.Join(dir, "link")
	os.Symlink(real, link)
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	group := filepath.Join(dir, "group")
	os.Mkdir(group, 0o700)
	os.Chmod(group, 0o770)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	cases := map[string]string{link: "symlink", open: "writable by group or others", group: "writable by group or others", file: "not a directory"}
	if os.Geteuid() == 0 {
		other := filepath.Join(dir, "other")
		os.Mkdir(other, 0o700)
		os.Chown(other, 65534, 65534)
		cases[other] = "owned by uid 65534"
	}
	for path, want := range cases {
		_, err := OpenRoot(path, true)
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenRoot(%s) = %v, want ErrUnsafe mentioning %q", filepath.Base(path), err, want)
		}
	}
	if _, err := OpenRoot(filepath.Join(dir, "missing"), false); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing root without create: %v", err)
	}
	r, err := OpenRoot(filepath.Join(dir, "new", "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	fi, _ := os.Stat(filepath.Join(dir, "new", "runs"))
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("new root mode %v, want 0700", fi.Mode().Perm())
	}
}

func TestCreateIsAClaim(t *testing.T) {
	r, d := newJob(t)
	if _, err := r.Create("job"); !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	fi, _ := os.Stat(d.Path)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir mode %v", fi.Mode().Perm())
	}
	if _, err := r.Open("nope"); !errors.Is(err, ErrNoRun) {
		t.Errorf("Open(nope) = %v", err)
	}
	if _, err := r.Create("../x"); !errors.Is(err, ErrBadID) {
		t.Errorf("Create(../x) = %v", err)
	}
}

// Files are never followed through symlinks or written through them, and
// files writable by others are refused.
func TestFilesNotFollowed(t *testing.T) {
	r, d := newJob(t)
	outside := filepath.Join(t.TempDir(), "target")
	os.WriteFile(outside, []byte("precious"), 0o600)
	os.Symlink(outside, filepath.Join(d.Path, "status.json"))
	if _, err := d.ReadFile("status.json"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("ReadFile through a symlink: %v", err)
	}
	if err := d.WriteAtomic("status.json", []byte("x"), Durable); !errors.Is(err, ErrUnsafe) {
		t.Errorf("WriteAtomic over a symlink: %v", err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "precious" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	os.WriteFile(filepath.Join(d.Path, "pid"), []byte("1\n"), 0o600)
	os.Chmod(filepath.Join(d.Path, "pid"), 0o666)
	if _, err := d.ReadFile("pid"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("world-writable file: %v", err)
	}
	// A run directory that is a symlink is refused too.
	os.Symlink(d.Path, filepath.Join(r.Path, "alias"))
	if _, err := r.Open("alias"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("Open(symlinked dir) = %v", err)
	}
}

func TestWriteAtomic(t *testing.T) {
	_, d := newJob(t)
	for _, v := range []string{"one", "two"} {
		if err := d.WriteAtomic("status.json", []byte(v), Durable); err != nil {
			t.Fatal(err)
		}
		b, err := d.ReadFile("status.json")
		if err != nil || string(b) != v {
			t.Fatalf("read %q, %v; want %q", b, err, v)
		}
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(d.Path, "status.json"), &st)
	if st.Mode&0o777 != 0o600 {
		t.Errorf("mode %o, want 600", st.Mode&0o777)
	}
	ents, _ := os.ReadDir(d.Path)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temp file left behind: %s", e.Name())
		}
	}
	if err := d.WriteOnce("pid", []byte("1\n")); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteOnce("pid", []byte("2\n")); err == nil {
		t.Error("WriteOnce overwrote an existing file")
	}
}

func TestTryLock(t *testing.T) {
	r := newRoot(t)
	unlock, err := r.TryLock(".test.lock")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.TryLock(".test.lock"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryLock: %v, want ErrLocked", err)
	}
	unlock()
	unlock2, err := r.TryLock(".test.lock")
	if err != nil {
		t.Fatalf("after unlock: %v", err)
	}
	unlock2()
	ids, _ := r.List()
	if len(ids) != 0 {
		t.Errorf("lock file listed as a run: %v", ids)
	}
}

// The run's lock is a flock on the run directory: no file is created for
// it, and two opens of the run (two processes, in effect) exclude each
// other, as do two goroutines sharing one Dir.
func TestLockIsTheDirectory(t *testing.T) {
	r, d := newJob(t)
	other, err := r.Open("job")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	unlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if d.Exists(LockFile) {
		t.Error("Lock created a lock file")
	}
	// Held exclusively: another open of the run cannot share it, and the
	// same Dir's other users wait too.
	if _, err := other.tryLockShared(); !errors.Is(err, ErrLocked) {
		t.Fatalf("tryLockShared while locked: %v, want ErrLocked", err)
	}
	if _, err := d.tryLockShared(); !errors.Is(err, ErrLocked) {
		t.Fatalf("tryLockShared on the same Dir while locked: %v, want ErrLocked", err)
	}
	lockWaitsFor(t, other, unlock, "the first Lock")
	// Shared holds coexist.
	u1, err := d.tryLockShared()
	if err != nil {
		t.Fatal(err)
	}
	u2, err := other.tryLockShared()
	if err != nil {
		t.Fatalf("two shared holds: %v", err)
	}
	u1()
	u2()
}

// lockWaitsFor fails unless d.Lock, called now, waits while holder keeps
// the lock (100 ms) and gets it once release has let it go (10 s).
func lockWaitsFor(t *testing.T, d *Dir, release func(), holder string) {
	t.Helper()
	got := make(chan struct{})
	go func() {
		if u, err := d.Lock(); err != nil {
			t.Error(err)
		} else {
			u()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatalf("Lock got the lock while %s held it", holder)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatalf("Lock did not get the lock after %s let it go", holder)
	}
}

// A run made by an agent-wrap that locked a `lock` file: Lock takes that
// file too, so an older wrapper holding it (here: a flock through a
// descriptor of our own) keeps a newer command waiting.
func TestLockTakesALegacyLockFile(t *testing.T) {
	r := newRoot(t)
	d, err := r.Create("old")
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	fd, err := unix.Open(filepath.Join(r.Path, "old", LockFile), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	d, err = r.Open("old")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.tryLockShared(); !errors.Is(err, ErrLocked) {
		t.Fatalf("tryLockShared while the old wrapper holds the lock file: %v, want ErrLocked", err)
	}
	lockWaitsFor(t, d, func() { unix.Flock(fd, unix.LOCK_UN) }, "the holder of the lock file")
}

// Visible fsyncs nothing and is still atomic; a failed replacement leaves
// no temp file and the old content.
func TestWriteAtomicVisibleAndFailure(t *testing.T) {
	_, d := newJob(t)
	if err := d.WriteAtomic("deadline_epoch", []byte("5\n"), Visible); err != nil {
		t.Fatal(err)
	}
	if b, _ := d.ReadFile("deadline_epoch"); string(b) != "5\n" {
		t.Fatalf("read %q", b)
	}
	// A directory in the way is refused.
	if err := os.Mkdir(filepath.Join(d.Path, "status.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAtomic("status.json", []byte("x"), Synced); err == nil {
		t.Fatal("WriteAtomic over a directory succeeded")
	}
	ents, _ := os.ReadDir(d.Path)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temp file left behind: %s", e.Name())
		}
	}
}
