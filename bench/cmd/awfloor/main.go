// Command awfloor is the file system's floor for one job: a program that
// does only the file work the contract needs around a job and nothing else,
// so that `make bench` can report agent-wrap's start and cancel against it.
//
//	awfloor ROOT RUN_ID CMD [ARG...]
//
// It claims ROOT/RUN_ID with mkdir, keeps events.jsonl open and writes a
// hash-chained line per step, creates stdout.log and stderr.log (the job's
// fds 1 and 2), records `starting`, starts CMD in a new session, writes pid
// and pgid, records `running` and waits. Each record is a temp file, fsynced,
// renamed over status.json (as CONTRACT.md has it); the final one also
// fsyncs the directory. When the job's leader exits it records `finished`
// with its code. On SIGTERM it is the recorded cancel: the intent journaled
// and fsynced, `cancelling` recorded, TERM to the group, every descendant
// reaped (it is their subreaper, so nothing of the job outlives the wait),
// `cancelled` recorded with its directory, exit 143.
//
// It has no lease, no grace timer, no locking, no streaming, no
// validation beyond reading the leader's start time and the boot ID: it is a
// limit to measure against, not a supervisor.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func main() { os.Exit(run(os.Args[1:])) }

type floor struct {
	dfd     int
	journal *os.File
	seq     int
	prev    string
	rec     statusfile.Record
}

func run(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: awfloor ROOT RUN_ID CMD [ARG...]")
		return 64
	}
	root, id, argv := args[0], args[1], args[2:]
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(err)
	}
	f, err := claim(root, id)
	if err != nil {
		return fail(err)
	}
	boot, err := proc.BootID()
	if err != nil {
		return fail(err)
	}
	self, err := proc.ReadStat(os.Getpid())
	if err != nil {
		return fail(err)
	}
	f.rec = statusfile.Record{Schema: statusfile.Schema, RunID: id, State: statusfile.Starting, WrapperPID: os.Getpid(), WrapperStart: self.Start,
		BootID: boot, Command: argv, CreatedAt: statusfile.Timestamp(time.Now()), Survivors: []int{}}
	f.line("created", false)
	stdout, err := f.create("stdout.log", unix.O_APPEND)
	if err != nil {
		return fail(err)
	}
	stderr, err := f.create("stderr.log", unix.O_APPEND)
	if err != nil {
		return fail(err)
	}
	if err := f.record(false); err != nil {
		return fail(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	stdout.Close()
	stderr.Close()
	pid := cmd.Process.Pid
	// Read the leader's start time before anything reaps it: until then it
	// is at least a zombie, and /proc/PID/stat is there.
	leader, err := proc.ReadStat(pid)
	if err != nil {
		return fail(err)
	}
	exits := reap()
	for _, name := range []string{"pid", "pgid"} {
		w, err := f.create(name, unix.O_EXCL)
		if err != nil {
			return fail(err)
		}
		w.WriteString(strconv.Itoa(pid) + "\n")
		w.Close()
	}
	f.rec.State, f.rec.PID, f.rec.PGID, f.rec.SID, f.rec.LeaderStart = statusfile.Running, pid, pid, pid, leader.Start
	f.rec.StartedAt = statusfile.Timestamp(time.Now())
	if err := f.record(false); err != nil {
		return fail(err)
	}
	f.line("started", false)
	for {
		select {
		case e := <-exits:
			if e.pid != pid {
				continue
			}
			code := e.ws.ExitStatus()
			if e.ws.Signaled() {
				code = 128 + int(e.ws.Signal())
			}
			f.rec.State = statusfile.Finished
			return f.final(code)
		case <-sigs:
			if err := f.line("cancel_requested", true); err != nil {
				return fail(err)
			}
			f.rec.State, f.rec.Cause = statusfile.Cancelling, statusfile.CauseTERM
			if err := f.record(false); err != nil {
				return fail(err)
			}
			unix.Kill(-pid, unix.SIGTERM)
			for range exits { // closed at ECHILD: nothing of the job is left
			}
			f.rec.State = statusfile.Cancelled
			return f.final(143)
		}
	}
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "awfloor: %v\n", err)
	return 70
}

// claim makes the run directory and opens it and the journal.
func claim(root, id string) (*floor, error) {
	rfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rfd)
	if err := unix.Mkdirat(rfd, id, 0o700); err != nil {
		return nil, err
	}
	dfd, err := unix.Openat(rfd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := &floor{dfd: dfd}
	if f.journal, err = f.create("events.jsonl", unix.O_APPEND); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *floor) create(name string, flag int) (*os.File, error) {
	fd, err := unix.Openat(f.dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|flag, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// line appends one chained journal line, fsynced when sync is set.
func (f *floor) line(event string, sync bool) error {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	f.seq++
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"seq":%d,"at":%q,"mono_ns":%d,"event":%q,"prev":%q}`, f.seq, statusfile.Timestamp(time.Now()), ts.Nano(), event, f.prev)
	sum := sha256.Sum256(b.Bytes())
	f.prev = hex.EncodeToString(sum[:])
	b.WriteByte('\n')
	if _, err := f.journal.Write(b.Bytes()); err != nil {
		return err
	}
	if sync {
		return f.journal.Sync()
	}
	return nil
}

// record replaces status.json: temp file, fsync, rename; durable also
// fsyncs the directory.
func (f *floor) record(durable bool) error {
	b, err := statusfile.Marshal(&f.rec)
	if err != nil {
		return err
	}
	tmp := ".status.json.tmp"
	w, err := f.create(tmp, unix.O_EXCL)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		w.Close()
		return err
	}
	if err := w.Sync(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	if err := unix.Renameat(f.dfd, tmp, f.dfd, "status.json"); err != nil {
		return err
	}
	if durable {
		return unix.Fsync(f.dfd)
	}
	return nil
}

func (f *floor) final(code int) int {
	f.rec.SetExit(code)
	f.rec.EndedAt = statusfile.Timestamp(time.Now())
	if err := f.record(true); err != nil {
		return fail(err)
	}
	f.line("final", false)
	return code
}

type exit struct {
	pid int
	ws  unix.WaitStatus
}

// reap waits for every child (and, as subreaper, every orphaned
// descendant) and sends each exit; it closes the channel at ECHILD.
func reap() <-chan exit {
	ch := make(chan exit, 16)
	go func() {
		defer close(ch)
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, 0, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			ch <- exit{pid, ws}
		}
	}()
	return ch
}
