//go:build linux || darwin || freebsd

package rundir

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

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
	return OpenDir("run root", path, create)
}

// OpenDir is OpenRoot for another directory kept under the same rules (a
// controller's ledger): what names it in the errors.
func OpenDir(what, path string, create bool) (*Root, error) {
	if create {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, path, err)
		}
		if err := unix.Mkdir(path, 0o700); err != nil && err != unix.EEXIST {
			return nil, fmt.Errorf("%s %s: create: %w", what, path, os.NewSyscallError("mkdir", err))
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if err == unix.ENOENT {
			return nil, fmt.Errorf("%s %s does not exist: %w", what, path, os.ErrNotExist)
		}
		return nil, fmt.Errorf("%s %s: %w", what, path, os.NewSyscallError("lstat", err))
	}
	if err := checkDir(what, path, &st); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, os.NewSyscallError("open", err))
	}
	// Check again through the descriptor: the path may have been swapped.
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s %s: %w", what, path, os.NewSyscallError("fstat", err))
	}
	if err := checkDir(what, path, &st); err != nil {
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
		// Someone else's directory in its private mode cannot be opened:
		// say whose it is, as for one that can (checkDir), not just EACCES.
		var st unix.Stat_t
		if unix.Fstatat(r.fd, id, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if cerr := checkDir("run directory", path, &st); cerr != nil {
				return nil, cerr
			}
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
	legacyLock := false
	for _, name := range runFiles {
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // absent (or vanished): each open checks again
		}
		if bad := badFile(&st); bad != "" {
			unix.Close(fd)
			return nil, fmt.Errorf("run directory %s: %s %s: %w", path, name, bad, ErrUnsafe)
		}
		legacyLock = legacyLock || name == LockFile
	}
	return &Dir{ID: id, Path: path, fd: fd, legacyLock: legacyLock}, nil
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
	names, err := readNames(r.Path)
	if err != nil {
		return nil, err
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

// readNames returns the names of the entries of the directory path, in
// the directory's order.
func readNames(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	return names, nil
}

// Dir is an opened run directory. Its methods take file names (no slashes).
type Dir struct {
	ID   string
	Path string
	fd   int

	// The run's lock within this process: a flock is held by an open file
	// description, which all users of this Dir share.
	rw           sync.RWMutex
	readersMu    sync.Mutex
	readers      int    // shared holders; the first takes the flock, the last drops it
	sharedUnlock func() // drops the shared flock
	legacyLock   bool   // the run has a `lock` file (made by an older agent-wrap)
}

// Close releases the directory's descriptor.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// Holds reports whether d is still the run directory ROOT/ID: not removed
// (a directory removed while open has no links) and not replaced by another
// directory of that name. Any error other than the name being gone counts
// as held: only a sure answer says a run's directory is gone.
func (r *Root) Holds(d *Dir) bool {
	var open, named unix.Stat_t
	if err := unix.Fstat(d.fd, &open); err != nil {
		return true
	}
	if open.Nlink == 0 {
		return false
	}
	if err := unix.Fstatat(r.fd, d.ID, &named, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err != unix.ENOENT && err != unix.ENOTDIR
	}
	return open.Dev == named.Dev && open.Ino == named.Ino
}

// FD is the directory's descriptor, for *at system calls.
func (d *Dir) FD() int { return d.fd }

// OpenFile opens name in the run directory without following a symlink. A
// file that exists must be a regular file owned by the caller and not
// writable by group or others; new files get mode perm (0600 in practice).
func (d *Dir) OpenFile(name string, flag int, perm uint32) (*os.File, error) {
	fd, _, err := d.openChecked(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.Path, name)), nil
}

// openChecked is OpenFile's open and checks, on a bare descriptor.
func (d *Dir) openChecked(name string, flag int, perm uint32) (int, *unix.Stat_t, error) {
	fd, err := unix.Openat(d.fd, name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		path := filepath.Join(d.Path, name)
		if err == unix.ELOOP {
			return -1, nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("is a symlink: %w", ErrUnsafe)}
		}
		return -1, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, &os.PathError{Op: "fstat", Path: filepath.Join(d.Path, name), Err: err}
	}
	if bad := badFile(&st); bad != "" {
		unix.Close(fd)
		return -1, nil, &os.PathError{Op: "open", Path: filepath.Join(d.Path, name), Err: fmt.Errorf("%s: %w", bad, ErrUnsafe)}
	}
	return fd, &st, nil
}

// ReadFile reads name in full (see OpenFile for the checks).
//
// It reads through the bare descriptor, into a buffer of the size fstat
// gave plus one byte, so a whole file is one read(2), not the three of a
// growing buffer: every command that judges many runs (list, watchdog,
// reconcile --all) reads a record per run, and list its deadline too. A
// read that returns less than it was asked for, ending where fstat said
// the file ends, is the end of a regular file (a short read of one is its
// end), so no second read(2) is made to see 0; a file that grew meanwhile
// fills the spare byte and is read on to its end.
func (d *Dir) ReadFile(name string) ([]byte, error) {
	fd, st, err := d.openChecked(name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, st.Size+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		asked := cap(buf) - len(buf)
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: filepath.Join(d.Path, name), Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if n < asked && int64(len(buf)) == st.Size {
			return buf, nil
		}
	}
}

// ModTime is the last modification time of name in the directory.
func (d *Dir) ModTime(name string) (time.Time, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return time.Time{}, &os.PathError{Op: "stat", Path: filepath.Join(d.Path, name), Err: err}
	}
	return time.Unix(st.Mtim.Unix()), nil
}

// Stamp is what one fstatat(2) says of a file: a file replaced (a new
// inode), written or truncated in place (size, modification and change
// times) has another stamp. A watcher compares stamps to read a file only
// when it may have changed.
type Stamp struct {
	Ino          uint64
	Size         int64
	Mtime, Ctime unix.Timespec
}

// StampOf returns name's Stamp (see Stamp).
func (d *Dir) StampOf(name string) (Stamp, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Stamp{}, &os.PathError{Op: "stat", Path: filepath.Join(d.Path, name), Err: err}
	}
	return Stamp{Ino: st.Ino, Size: st.Size, Mtime: st.Mtim, Ctime: st.Ctim}, nil
}

// Exists reports whether name exists (as anything) in the directory.
func (d *Dir) Exists(name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// Durability says what a replacement of a file survives.
type Durability int

const (
	// Visible: atomic for every process of this boot (a reader sees the old
	// content or the new, never a mix or an empty file), and nothing is
	// fsynced: after a crash of the machine the file may hold the old
	// content, or be empty.
	Visible Durability = iota
	// Synced: as Visible, and the new content is fsynced before the
	// rename, so the file is never empty or torn, even after a power loss;
	// the rename itself may be lost with it.
	Synced
	// Durable: as Synced, and the directory is fsynced after the rename,
	// so the replacement itself survives a power loss.
	Durable
)

// WriteAtomic replaces name with data: a temp file in the run directory
// (".NAME.PID.RANDOM", created relative to the directory's descriptor, mode
// 0600, PID the writer's), renamed over name, with the fsyncs that how asks
// for. A reader sees the old content or the new, never a mix or an empty
// file. On an error the temp file is removed and name is untouched.
//
// On a full file system (ENOSPC, EDQUOT) a temp file cannot get blocks, but
// the file being replaced has them: when name exists and data fits in
// its blocks, WriteAtomic then overwrites it in place (OverwriteInPlace;
// else it fails and name is untouched), which is not atomic for a
// reader (it may see a torn file meanwhile, and must treat it as
// unreadable) but lands where a rename cannot. The error is nil then.
func (d *Dir) WriteAtomic(name string, data []byte, how Durability) error {
	err := d.replace(name, data, how)
	if err != nil && NoSpace(err) && d.Exists(name) {
		if ierr := d.OverwriteInPlace(name, data, how >= Synced); ierr == nil {
			return nil
		}
	}
	return err
}

// NoSpace reports whether err is the file system being full (ENOSPC) or
// the user's quota used up (EDQUOT).
func NoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

func (d *Dir) replace(name string, data []byte, how Durability) error {
	path := filepath.Join(d.Path, name)
	// The target may not be a symlink or someone else's file; rename would
	// replace a symlink rather than follow it, but a planted file is a sign
	// of tampering worth refusing.
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
			return &os.PathError{Op: "replace", Path: path, Err: fmt.Errorf("existing file is not a regular file of yours: %w", ErrUnsafe)}
		}
	}
	var fd int
	var tmp string
	prefix := tempPrefix(name) + strconv.Itoa(os.Getpid()) + "."
	for try := 0; ; try++ {
		tmp = prefix + strconv.FormatUint(uint64(rand.Uint32()), 36)
		var err error
		fd, err = unix.Openat(d.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			break
		}
		if err != unix.EEXIST || try == 9 {
			return &os.PathError{Op: "create", Path: filepath.Join(d.Path, tmp), Err: err}
		}
	}
	err := writeAll(fd, data)
	if err == nil && how >= Synced {
		if err = unix.Fsync(fd); err != nil {
			err = os.NewSyscallError("fsync", err)
		}
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = os.NewSyscallError("close", cerr)
	}
	if err == nil {
		if err = unix.Renameat(d.fd, tmp, d.fd, name); err != nil {
			err = os.NewSyscallError("rename", err)
		}
	}
	if err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return &os.PathError{Op: "replace", Path: path, Err: err}
	}
	if how >= Durable {
		return d.Sync()
	}
	return nil
}

// tempPrefix is the start of the name of every temp file WriteAtomic makes
// for name.
func tempPrefix(name string) string { return "." + name + "." }

// OverwriteInPlace writes data over the existing file name from its first
// byte and cuts it to len(data), fsyncing it when sync is set. It needs no
// new blocks where the file already had as many (a record rewritten with a
// few more fields stays within its last block), so it works on a full file
// system; but a reader may see the old content, the new, or a mix while it
// runs. Data longer than the blocks the file has is refused (ENOSPC)
// before a byte is written: on a full file system the write would stop
// where the blocks end and leave the file a cut prefix of data, unreadable
// until a later write lands, where refusing leaves the old content whole.
// WriteAtomic falls back to it on a full file system; the caller holds the
// run's lock, so no other writer interleaves.
func (d *Dir) OverwriteInPlace(name string, data []byte, sync bool) error {
	fd, st, err := d.openChecked(name, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	path := filepath.Join(d.Path, name)
	if int64(len(data)) > st.Blocks*512 { // st_blocks counts 512-byte units
		return &os.PathError{Op: "overwrite", Path: path, Err: fmt.Errorf("%d bytes over a file with %d allocated: %w", len(data), st.Blocks*512, unix.ENOSPC)}
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "overwrite", Path: path, Err: err}
		}
		off += n
	}
	if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
		return &os.PathError{Op: "truncate", Path: path, Err: err}
	}
	if sync {
		if err := unix.Fsync(fd); err != nil {
			return &os.PathError{Op: "fsync", Path: path, Err: err}
		}
	}
	return nil
}

// staleTempAge is how old a temp file without a writer's PID in its name
// (made by an older agent-wrap) must be before RemoveStaleTemps removes it.
const staleTempAge = time.Minute

// RemoveStaleTemps removes the temp files WriteAtomic left for name when
// their writer died between creating and renaming them (".NAME.PID.RANDOM"
// whose PID no longer runs; one without a PID once it is a minute old). A
// writer that is alive, even stopped, keeps its temp file. It returns the
// names removed.
func (d *Dir) RemoveStaleTemps(name string) ([]string, error) {
	names, err := readNames(d.Path)
	if err != nil {
		return nil, err
	}
	prefix := tempPrefix(name)
	var removed []string
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, prefix)
		if !ok || rest == "" {
			continue
		}
		if !d.staleTemp(n, rest) {
			continue
		}
		if err := unix.Unlinkat(d.fd, n, 0); err == nil {
			removed = append(removed, n)
		}
	}
	return removed, nil
}

// staleTemp says whether the temp file n (rest: what follows ".NAME.") was
// left by a writer that is gone.
func (d *Dir) staleTemp(n, rest string) bool {
	if pidPart, _, ok := strings.Cut(rest, "."); ok {
		if pid, err := strconv.Atoi(pidPart); err == nil && pid > 0 {
			if pid == os.Getpid() {
				return false
			}
			err := unix.Kill(pid, 0)
			return err == unix.ESRCH
		}
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false
	}
	return time.Since(time.Unix(st.Mtim.Unix())) > staleTempAge
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return os.NewSyscallError("write", err)
		}
		b = b[n:]
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

// RemoveTemps removes the temp files WriteAtomic left for name
// (".NAME.RANDOM") and returns their names. A writer stopped half way
// through its replacement then cannot rename its temp file over a record
// written since: its rename fails (ENOENT). Only a caller that knows that
// writer to be stuck may do this.
func (d *Dir) RemoveTemps(name string) ([]string, error) {
	names, err := readNames(d.Path)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, n := range names {
		if strings.HasPrefix(n, tempPrefix(name)) {
			if err := d.Remove(n); err != nil {
				return removed, err
			}
			removed = append(removed, n)
		}
	}
	return removed, nil
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

// Lock takes the run's exclusive lock, which serialises state transitions
// between wrapper, renew, cancel, watchdog and gc, waiting at most LockWait
// (LockWithin). The lock is a flock on the run directory itself (no file to
// create, no open: the directory's descriptor is already held), and, for a
// run made by an agent-wrap that locked a `lock` file instead, on that file
// as well (always after the directory), so an older wrapper still
// supervising such a run and a newer command serialise with each other.
// Goroutines of one process that lock the same Dir wait for each other too.
func (d *Dir) Lock() (unlock func(), err error) { return d.LockWithin(LockWait) }

// LockWithin is Lock waiting at most wait (0: one try). A lock still held
// then is a *HeldError (errors.Is ErrLocked) that names the processes
// holding it, by PID, start time, state and executable, so a caller can
// tell a holder that is merely slow from one that is stopped or hung, and
// say whom the user should look at.
func (d *Dir) LockWithin(wait time.Duration) (unlock func(), err error) {
	start := time.Now()
	until := start.Add(wait)
	for pause := time.Millisecond; !d.rw.TryLock(); pause = min(2*pause, 25*time.Millisecond) {
		left := time.Until(until)
		if left <= 0 {
			return nil, &HeldError{Path: d.Path, Waited: time.Since(start), Holders: holdersOf(d.fd)}
		}
		time.Sleep(min(pause, left))
	}
	u, err := d.flock(unix.LOCK_EX, start, until)
	if err != nil {
		d.rw.Unlock()
		return nil, err
	}
	return func() { u(); d.rw.Unlock() }, nil
}

// tryLockShared takes the run's lock shared, without waiting: ErrLocked
// when someone holds it exclusively. Shared holders in this process share
// one flock, taken by the first and released by the last.
func (d *Dir) tryLockShared() (unlock func(), err error) {
	if !d.rw.TryRLock() {
		return nil, fmt.Errorf("run %s: %w", d.ID, ErrLocked)
	}
	d.readersMu.Lock()
	defer d.readersMu.Unlock()
	if d.readers == 0 {
		now := time.Now()
		u, err := d.flock(unix.LOCK_SH, now, now)
		if err != nil {
			d.rw.RUnlock()
			return nil, err
		}
		d.sharedUnlock = u
	}
	d.readers++
	return func() {
		d.readersMu.Lock()
		if d.readers--; d.readers == 0 {
			d.sharedUnlock()
			d.sharedUnlock = nil
		}
		d.readersMu.Unlock()
		d.rw.RUnlock()
	}, nil
}

// flock locks the directory and, where there is one, the legacy lock file,
// waiting until until at most (a lock still held then is a *HeldError).
func (d *Dir) flock(how int, start, until time.Time) (unlock func(), err error) {
	if err := flockUntil(d.fd, d.Path, how, start, until); err != nil {
		return nil, err
	}
	dirUnlock := func() { _ = unix.Flock(d.fd, unix.LOCK_UN) }
	if !d.legacyLock {
		return dirUnlock, nil
	}
	f, err := d.OpenFile(LockFile, unix.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return dirUnlock, nil
		}
		dirUnlock()
		return nil, err
	}
	if err := flockUntil(int(f.Fd()), f.Name(), how, start, until); err != nil {
		f.Close()
		dirUnlock()
		return nil, err
	}
	return func() { f.Close(); dirUnlock() }, nil
}

// RLock takes the run's lock shared, for a reader that must not see a
// state transition half done, waiting at most wait (polling, since a
// reader never queues behind writers). busy is true when someone held the
// lock exclusively all that time; the caller then reads without it, and
// says so. Any other failure to lock is not reported: the caller reads as
// if the run were not locked.
func (d *Dir) RLock(wait time.Duration) (unlock func(), busy bool) {
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		unlock, err := d.tryLockShared()
		if err == nil {
			return unlock, false
		}
		if !errors.Is(err, ErrLocked) {
			return func() {}, false
		}
		if time.Now().After(deadline) {
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

// ErrLocked is what a lock still held at the end of its wait is (see
// HeldError, which names the holders).
var ErrLocked = errors.New("locked by another process")

// TryLock takes an exclusive, non-blocking flock on the root-level file
// name (a dot-file, so it is never listed as a run), e.g. the watchdog's
// one-instance-per-root lock. A *HeldError (ErrLocked) means someone else
// holds it, and names who.
func (r *Root) TryLock(name string) (unlock func(), err error) {
	// Read-only: a flock needs no write access, and a descriptor open for
	// writing, held for a watchdog's life, would make the file system
	// refuse a remount read-only (EBUSY). On a root already read-only a
	// lock file that exists opens all the same, and the watchdog runs.
	fd, err := unix.Openat(r.fd, name, unix.O_RDONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(r.Path, name), Err: err}
	}
	now := time.Now()
	if err := flockUntil(fd, filepath.Join(r.Path, name), unix.LOCK_EX, now, now); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return func() { unix.Close(fd) }, nil
}

// Touch sets the modification time of the root-level file name to now: a
// holder of a lock on it (the watchdog) says so that it is still at work.
func (r *Root) Touch(name string) error {
	if err := unix.UtimesNanoAt(r.fd, name, nil, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: filepath.Join(r.Path, name), Err: err}
	}
	return nil
}

// Age is how long ago the root-level file name was last modified.
func (r *Root) Age(name string) (time.Duration, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(r.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, &os.PathError{Op: "stat", Path: filepath.Join(r.Path, name), Err: err}
	}
	return time.Since(time.Unix(st.Mtim.Unix())), nil
}
