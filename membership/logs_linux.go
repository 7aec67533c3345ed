package membership

import (
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// Logs names a run's log files, stdout.log and stderr.log, by device and
// inode (LogsOf). The wrapper opens them for the job alone and hands them
// to it as its fds 1 and 2, so a process whose fd 1 or 2 is one of them is
// the job or was started below it, wherever it went since: another
// session, another parent, no parent of the run's left alive. That is how
// a stop from outside a run without a cgroup finds what left the session
// unrecorded after the wrapper died. A process that moved its own fds 1
// and 2 elsewhere (or of another user, whose descriptors cannot be read)
// is not found this way.
type Logs struct {
	d     *rundir.Dir
	files []unix.Stat_t
	names []string
}

// LogsOf returns the run's log files as they are now; none where they
// cannot be read.
func LogsOf(d *rundir.Dir) Logs {
	l := Logs{d: d}
	for _, name := range []string{rundir.StdoutFile, rundir.StderrFile} {
		var st unix.Stat_t
		if err := unix.Fstatat(d.FD(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			l.files = append(l.files, st)
			l.names = append(l.names, name)
		}
	}
	return l
}

// Known reports whether any log file was found.
func (l Logs) Known() bool { return len(l.files) > 0 }

// Holds reports whether fd (1 or 2) of pid is one of the run's log files.
func (l Logs) Holds(pid, fd int) bool {
	if len(l.files) == 0 {
		return false
	}
	var st unix.Stat_t
	if unix.Stat("/proc/"+strconv.Itoa(pid)+"/fd/"+strconv.Itoa(fd), &st) != nil {
		return false
	}
	for _, f := range l.files {
		if st.Dev == f.Dev && st.Ino == f.Ino {
			return true
		}
	}
	return false
}

// holders returns the live processes of all, not yet judged, that started
// no earlier than the run's wrapper and hold one of the run's logs as fd 1
// or 2, the wrapper itself left out (it opens them for the job, and to
// stream them).
func (r Run) holders(all []proc.Stat, judged map[int]bool) []Member {
	rec := r.Record
	if unheld, ok := r.Logs.Unheld(); !r.Logs.Known() || unheld && ok {
		return nil // no process has them open for writing: none to look for
	}
	var found []Member
	for _, p := range all {
		if judged[p.PID] || p.Dead() || p.PID == rec.WrapperPID || p.Start < rec.WrapperStart {
			continue
		}
		if r.Logs.Holds(p.PID, 1) || r.Logs.Holds(p.PID, 2) {
			judged[p.PID] = true
			found = append(found, Member{Stat: p, Escaped: true, Identity: proc.Identity{PID: p.PID, Start: p.Start}})
		}
	}
	return found
}

// Unheld reports whether no process has the run's logs open for writing:
// the kernel's own answer, asked with a read lease (fcntl F_SETLEASE
// F_RDLCK), which is granted only on a file no one has open for writing,
// and given back at once. A reader (attach, tail -f) does not count, a
// zombie has closed its files, a stopped process has not. So once a stop
// has seen every holder die, Unheld is the proof that none it could not
// see is left, as an unpopulated cgroup is for a run with one: it sees
// what a look at /proc missed (a process forked as the look read the
// table). ok is false where the kernel cannot tell (no leases on this file
// system, or not the files' owner without CAP_LEASE).
func (l Logs) Unheld() (unheld, ok bool) {
	if l.d == nil || len(l.files) == 0 {
		return false, false
	}
	for i, name := range l.names {
		f, err := l.d.OpenFile(name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return false, false
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) != nil || st.Dev != l.files[i].Dev || st.Ino != l.files[i].Ino {
			f.Close()
			return false, false // not the file the run began with
		}
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_RDLCK)
		if err == nil {
			_, _ = unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
		}
		f.Close()
		switch {
		case err == unix.EAGAIN:
			return false, true
		case err != nil:
			return false, false
		}
	}
	return true, true
}
