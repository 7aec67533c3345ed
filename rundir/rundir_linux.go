package rundir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"
)

// Root is an opened, checked run root.
type Root struct {
	Path string
	fd   int
}

// OpenRoot opens the run root at path (absolute), creating it with mode 0700
// when create is set and it is missing. It refuses, with ErrUnsafe, a root
// that is a symlink, is not a directory, is not owned by the effective user,
// or is writable by group or others. A missing root without create is
// reported as an error wrapping os.ErrNotExist.
func OpenRoot(path string, create bool) (*Root, error) {
	if create {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("run root %s: %w", path, err)
		}
		if err := unix.Mkdir(path, 0o700); err != nil && err != unix.EEXIST {
			return nil, fmt.Errorf("run root %s: create: %w", path, os.NewSyscallError("mkdir", err))
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if err == unix.ENOENT {
			return nil, fmt.Errorf("run root %s does not exist: %w", path, os.ErrNotExist)
		}
		return nil, fmt.Errorf("run root %s: %w", path, os.NewSyscallError("lstat", err))
	}
	if err := checkDir("run root", path, &st); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("run root %s: %w", path, os.NewSyscallError("open", err))
	}
	// Check again through the descriptor: the path may have been swapped.
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("run root %s: %w", path, os.NewSyscallError("fstat", err))
	}
	if err := checkDir("run root", path, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Root{Path: path, fd: fd}, nil
}

func checkDir(what, path string, st *unix.Stat_t) error {
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("%s %s is a symlink: %w", what, path, ErrUnsafe)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s %s is not a directory: %w", what, path, ErrUnsafe)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s %s is owned by uid %d, not by you (uid %d): %w", what, path, st.Uid, os.Geteuid(), ErrUnsafe)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%s %s has mode %04o, writable by group or others: %w", what, path, st.Mode&0o7777, ErrUnsafe)
	}
	return nil
}

// Close releases the root's descriptor.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Create claims id: it makes the run directory with mkdir, which fails if
// the directory exists, so exactly one caller ever owns an ID.
func (r *Root) Create(id string) (*Dir, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	if err := unix.Mkdirat(r.fd, id, 0o700); err != nil {
		if err == unix.EEXIST {
			return nil, fmt.Errorf("run %s: %w", id, ErrExists)
		}
		return nil, &os.PathError{Op: "mkdir", Path: filepath.Join(r.Path, id), Err: err}
	}
	return r.Open(id)
}

// Open opens the existing run directory id after checking that it is a real
// directory owned by the caller and not writable by group or others, and
// that none of the run's files (runFiles) present is a symlink, someone
// else's or writable by group or others.
func (r *Root) Open(id string) (*Dir, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	path := filepath.Join(r.Path, id)
	fd, err := unix.Openat(r.fd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		switch err {
		case unix.ENOENT:
			return nil, fmt.Errorf("run %s: %w under %s", id, ErrNoRun, r.Path)
		case unix.ELOOP, unix.ENOTDIR:
			return nil, fmt.Errorf("run directory %s is a symlink or not a directory: %w", path, ErrUnsafe)
		}
		return nil, fmt.Errorf("run directory %s: %w", path, os.NewSyscallError("open", err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("run directory %s: %w", path, os.NewSyscallError("fstat", err))
	}
	if err := checkDir("run directory", path, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// The run directory is judged whole: one of its files that is a
	// symlink, someone else's or writable by others means it was tampered
	// with, and no command reads, writes or signals anything on its word.
	for _, name := range runFiles {
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // absent (or vanished): each open checks again
		}
		if bad := badFile(&st); bad != "" {
			unix.Close(fd)
			return nil, fmt.Errorf("run directory %s: %s %s: %w", path, name, bad, ErrUnsafe)
		}
	}
	return &Dir{ID: id, Path: path, fd: fd}, nil
}

// runFiles are the files of a run directory that Open checks.
var runFiles = []string{StatusFile, PIDFile, PGIDFile, DeadlineFile, StdoutFile, StderrFile, EventsFile, LockFile}

// badFile says what is wrong with a run's file, or "" if nothing is: it
// must be a regular file (not a symlink), owned by the caller and not
// writable by group or others.
func badFile(st *unix.Stat_t) string {
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return "is a symlink"
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return "is not a regular file"
	case int(st.Uid) != os.Geteuid():
		return fmt.Sprintf("is owned by uid %d, not by you", st.Uid)
	case st.Mode&0o022 != 0:
		return fmt.Sprintf("has mode %04o, writable by group or others", st.Mode&0o7777)
	}
	return ""
}

// List returns the IDs of the entries below the root that look like runs
// (valid IDs), sorted. It does not open or check them.
func (r *Root) List() ([]string, error) {
	f, err := os.Open(r.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", r.Path, err)
	}
	ids := names[:0]
	for _, n := range names {
		if ValidID(n) == nil && !strings.HasPrefix(n, ".") {
			ids = append(ids, n)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Dir is an opened run directory. Its methods take file names (no slashes).
type Dir struct {
	ID   string
	Path string
	fd   int
}

// Close releases the directory's descriptor.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// FD is the directory's descriptor, for *at system calls.
func (d *Dir) FD() int { return d.fd }

// OpenFile opens name in the run directory without following a symlink. A
// file that exists must be a regular file owned by the caller and not
// writable by group or others; new files get mode perm (0600 in practice).
func (d *Dir) OpenFile(name string, flag int, perm uint32) (*os.File, error) {
	path := filepath.Join(d.Path, name)
	fd, err := unix.Openat(d.fd, name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		if err == unix.ELOOP {
			return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("is a symlink: %w", ErrUnsafe)}
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if bad := badFile(&st); bad != "" {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%s: %w", bad, ErrUnsafe)}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// ReadFile reads name in full (see OpenFile for the checks).
func (d *Dir) ReadFile(name string) ([]byte, error) {
	f, err := d.OpenFile(name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Exists reports whether name exists (as anything) in the directory.
func (d *Dir) Exists(name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// WriteAtomic replaces name with data: a renameio pending file in the run
// directory itself, fsynced, renamed over name. A reader sees the old content
// or the new, never a mix or an empty file. With durable set the directory is
// fsynced too, so the rename survives a power loss.
func (d *Dir) WriteAtomic(name string, data []byte, durable bool) error {
	// The target may not be a symlink or someone else's file; rename would
	// replace a symlink rather than follow it, but a planted file is a sign
	// of tampering worth refusing.
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
			return &os.PathError{Op: "replace", Path: filepath.Join(d.Path, name), Err: fmt.Errorf("existing file is not a regular file of yours: %w", ErrUnsafe)}
		}
	}
	path := filepath.Join(d.Path, name)
	t, err := renameio.NewPendingFile(path, renameio.WithTempDir(d.Path), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return err
	}
	defer t.Cleanup()
	if _, err := t.Write(data); err != nil {
		return err
	}
	if err := t.CloseAtomicallyReplace(); err != nil {
		return err
	}
	if durable {
		return d.Sync()
	}
	return nil
}

// WriteOnce creates name with data; it fails if name exists. It does not
// fsync: the wrapper's pid and pgid are also in the durable `running`
// record, which is what survives a crash.
func (d *Dir) WriteOnce(name string, data []byte) error {
	f, err := d.OpenFile(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Remove removes the file name, if present.
func (d *Dir) Remove(name string) error {
	err := unix.Unlinkat(d.fd, name, 0)
	if err != nil && err != unix.ENOENT {
		return &os.PathError{Op: "remove", Path: filepath.Join(d.Path, name), Err: err}
	}
	return nil
}

// Sync fsyncs the directory, making renames and creations in it durable.
func (d *Dir) Sync() error {
	if err := unix.Fsync(d.fd); err != nil {
		return &os.PathError{Op: "fsync", Path: d.Path, Err: err}
	}
	return nil
}

// Lock takes the run's exclusive lock (flock on the lock file), which
// serialises state transitions between wrapper, renew, cancel and watchdog.
// It blocks until the lock is free. unlock releases it.
func (d *Dir) Lock() (unlock func(), err error) {
	f, err := d.OpenFile(LockFile, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: f.Name(), Err: err}
	}
	return func() { f.Close() }, nil
}

// RLock takes the run's lock shared, for a reader that must not see a
// state transition half done, waiting at most wait (polling, since a
// reader never queues behind writers). It never creates the lock file and
// opens it read-only: a missing lock file means no one ever locked the run,
// and unlock is a no-op. busy is true when someone held the lock
// exclusively all that time; the caller then reads without it, and says
// so. Any other failure to lock is not reported: the caller reads as if the
// run had no lock file.
func (d *Dir) RLock(wait time.Duration) (unlock func(), busy bool) {
	f, err := d.OpenFile(LockFile, unix.O_RDONLY, 0)
	if err != nil {
		return func() {}, false
	}
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, false
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return func() {}, false
		}
		if time.Now().After(deadline) {
			f.Close()
			return func() {}, true
		}
		time.Sleep(pause)
		if pause < 50*time.Millisecond {
			pause *= 2
		}
	}
}

// RemoveAll deletes the run directory id and everything in it. The caller
// decides whether the run may be removed.
func (r *Root) RemoveAll(id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	d, err := r.Open(id)
	if err != nil {
		return err
	}
	d.Close()
	return os.RemoveAll(filepath.Join(r.Path, id))
}

// IsUnsafe reports whether err is a safety refusal.
func IsUnsafe(err error) bool { return errors.Is(err, ErrUnsafe) }

// ErrLocked is returned by Root.TryLock when another process holds the lock.
var ErrLocked = errors.New("locked by another process")

// TryLock takes an exclusive, non-blocking flock on the root-level file
// name (a dot-file, so it is never listed as a run), e.g. the watchdog's
// one-instance-per-root lock. ErrLocked means someone else holds it.
func (r *Root) TryLock(name string) (unlock func(), err error) {
	fd, err := unix.Openat(r.fd, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(r.Path, name), Err: err}
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("%s: %w", filepath.Join(r.Path, name), ErrLocked)
		}
		return nil, &os.PathError{Op: "flock", Path: filepath.Join(r.Path, name), Err: err}
	}
	return func() { unix.Close(fd) }, nil
}
