//go:build linux

package cli_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// startRun starts `agent-wrap run ARGS` and registers cleanup that kills
// what is left of the run by its recorded group.
func startRun(t *testing.T, root, id string, args ...string) (*runtest.Cmd, runtest.Run) {
	t.Helper()
	r := runtest.Run{Root: root, ID: id}
	t.Cleanup(r.Kill)
	c := runtest.Start(t, root, append([]string{"run"}, args...)...)
	return c, r
}

func indexOf(events []string, name string) int {
	for i, e := range events {
		if e == name {
			return i
		}
	}
	return -1
}

// readPID reads a PID a job wrote to a file (0 until it is complete).
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return 0
	}
	v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return v
}

// execCode runs a command to completion and returns its exit code.
func execCode(name string, args ...string) (int, error) {
	cmd := exec.Command(name, args...)
	err := cmd.Run()
	if cmd.ProcessState != nil {
		return cmd.ProcessState.ExitCode(), nil
	}
	return -1, err
}

// TERM straight to the job leader: the leader dies of it, the rest of its
// group is stopped, and the run finishes with 143 and signal TERM.
func TestRunTermLeader(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "leader", "leader", "--", "sh", "-c", "sleep 300 & sleep 300 & wait")
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "three group members", func() bool { return len(runtest.Members(rec.PGID)) >= 3 })
	if err := unix.Kill(rec.PID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(t); code != 143 {
		t.Fatalf("exit %d, want 143\n%s", code, c.Stderr.String())
	}
	r.AssertGroupEmpty(t)
	rec = r.MustStatus(t)
	if rec.State != statusfile.Finished || rec.Signal != "TERM" || rec.Code() != 143 {
		t.Fatalf("record: state %s signal %q code %d", rec.State, rec.Signal, rec.Code())
	}
	if indexOf(r.Events(t), "stragglers_stopped") < 0 {
		t.Fatalf("no stragglers_stopped event: %v", r.Events(t))
	}
}

// Two runs under one root: stopping one leaves every process of the other.
func TestRunStopOneLeavesOther(t *testing.T) {
	root := runtest.NewRoot(t)
	ca, a := startRun(t, root, "a", "a", "--", "sh", "-c", "sleep 300 & sleep 300 & wait")
	cb, b := startRun(t, root, "b", "b", "--", "sh", "-c", "sleep 300 & sleep 300 & wait")
	ra := a.WaitState(t, statusfile.Running)
	rb := b.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "both groups populated", func() bool {
		return len(runtest.Members(ra.PGID)) == 3 && len(runtest.Members(rb.PGID)) == 3
	})
	before := runtest.Members(rb.PGID)
	unix.Kill(ra.WrapperPID, unix.SIGTERM)
	if code := ca.Wait(t); code != 143 {
		t.Fatalf("a: exit %d", code)
	}
	a.AssertGroupEmpty(t)
	for _, p := range before {
		if !proc.Alive(p.PID, p.Start) {
			t.Fatalf("b's process %d died when a was stopped", p.PID)
		}
	}
	if cb.Exited() {
		t.Fatal("b's wrapper exited")
	}
	unix.Kill(rb.WrapperPID, unix.SIGTERM)
	cb.Wait(t)
	b.AssertGroupEmpty(t)
}

// 50 MB of output: stdout.log holds exactly what the job wrote, and so does
// the streamed copy.
func TestRunLargeOutputByteIdentical(t *testing.T) {
	root := runtest.NewRoot(t)
	// 50 MB of pseudo-random bytes, so a dropped or repeated block shows.
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, pseudoRandom(50<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	c, r := startRun(t, root, "big", "--lease", "0", "big", "--", "cat", src)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("exit %d: %s", code, c.Stderr.String())
	}
	want, _ := os.ReadFile(src)
	got, _ := os.ReadFile(filepath.Join(r.Dir(), "stdout.log"))
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatalf("stdout.log: %d bytes, differs from the %d the job wrote", len(got), len(want))
	}
	if !bytes.Equal(c.Stdout.Bytes(), want) {
		t.Fatalf("streamed copy: %d bytes, differs from the %d the job wrote", c.Stdout.Len(), len(want))
	}
}

func pseudoRandom(n int) []byte {
	b := make([]byte, n)
	x := uint64(0x9E3779B97F4A7C15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// status.json, read over and over while 30 runs start and finish, is
// always a complete, valid record. One reader, pausing a little between
// sweeps: two readers spinning flat out took both CPUs from the 30
// wrappers they watch (and from every test beside them), and made this
// test the slowest of the package without reading more records per write.
func TestStatusAlwaysValidUnderChurn(t *testing.T) {
	root := runtest.NewRoot(t)
	const n = 30
	churn(t, root, "churn", n, 1, 200*time.Microsecond, nil, []string{"sh", "-c", "exit 0"}, "no valid record",
		func(_, _ string, status []byte) error {
			if _, err := statusfile.Parse(status); err != nil {
				return fmt.Errorf("%v: %q", err, status)
			}
			return nil
		})
}

// churn starts n runs, PREFIX-0 on (`run --no-stream FLAGS ID -- JOB`),
// and waits for each to exit 0, while readers goroutines look at every
// run over and over, pausing between sweeps. A run is there to see once
// its status.json is; look is given its ID, directory and status.json as
// read, and says what is wrong with the run. The test fails if any look
// found something wrong (what names it: "no valid record"), or if fewer
// than n looks saw a run.
func churn(t *testing.T, root, prefix string, n, readers int, pause time.Duration, flags, job []string, what string, look func(id, dir string, status []byte) error) {
	t.Helper()
	var stop atomic.Bool
	var nSeen, nBad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ; !stop.Load(); time.Sleep(pause) {
				for j := 0; j < n; j++ {
					id := fmt.Sprintf("%s-%d", prefix, j)
					dir := filepath.Join(root, id)
					status, err := os.ReadFile(filepath.Join(dir, "status.json"))
					if err != nil {
						continue // not created yet
					}
					nSeen.Add(1)
					if err := look(id, dir, status); err != nil {
						nBad.Add(1)
						firstBad.CompareAndSwap(nil, err.Error())
					}
				}
			}
		}()
	}
	var cmds []*runtest.Cmd
	for j := 0; j < n; j++ {
		id := fmt.Sprintf("%s-%d", prefix, j)
		args := append(append(append([]string{"--no-stream"}, flags...), id, "--"), job...)
		c, _ := startRun(t, root, id, args...)
		cmds = append(cmds, c)
	}
	for _, c := range cmds {
		if code := c.Wait(t); code != 0 {
			t.Errorf("exit %d: %s", code, c.Stderr.String())
		}
	}
	stop.Store(true)
	wg.Wait()
	if nBad.Load() > 0 {
		t.Fatalf("%d of %d looks at a visible run found %s; first: %v", nBad.Load(), nSeen.Load(), what, firstBad.Load())
	}
	if nSeen.Load() < int64(n) {
		t.Fatalf("only %d looks at a visible run", nSeen.Load())
	}
}

// `true` and `sh -c 'exit 3'`, 100 runs each: every one finished with its
// code. Most exit before the wrapper inspects them; the session check must
// not depend on the job still running.
func TestRunManyShortJobs(t *testing.T) {
	root := runtest.NewRoot(t)
	bin := runtest.Binary(t)
	type job struct {
		argv []string
		code int
	}
	jobs := []job{{[]string{"true"}, 0}, {[]string{"sh", "-c", "exit 3"}, 3}}
	var wg sync.WaitGroup
	errs := make(chan string, 200)
	sem := make(chan struct{}, 4)
	for i := 0; i < 100; i++ {
		for k, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				id := fmt.Sprintf("short-%d-%d", k, i)
				args := append([]string{"--root", root, "run", "--no-stream", "--lease", "0", id, "--"}, j.argv...)
				code, err := execCode(bin, args...)
				if err != nil || code != j.code {
					errs <- fmt.Sprintf("%s: exit %d (%v), want %d", id, code, err, j.code)
					return
				}
				r := runtest.Run{Root: root, ID: id}
				rec := r.Status()
				if rec == nil || rec.State != statusfile.Finished || rec.Code() != j.code {
					errs <- fmt.Sprintf("%s: record %+v", id, rec)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// The job inherits exactly fds 0, 1 and 2: no descriptor of the wrapper's
// (run directory, journal, lock, inotify, pipes) leaks into it. Read from
// outside, through /proc/PID/fd of the running leader.
func TestRunJobHasOnlyStdio(t *testing.T) {
	root := runtest.NewRoot(t)
	c, r := startRun(t, root, "fds", "fds", "--", "sleep", "300")
	rec := r.WaitState(t, statusfile.Running)
	// `running` is written once execve has succeeded, but the dynamic
	// loader of the new image still opens ld.so.cache and libc on fd 3 for
	// a moment after that. A descriptor agent-wrap leaked stays open for
	// the job's life, so wait for the set to settle and fail if it never
	// comes down to 0, 1, 2.
	var fds []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", rec.PID))
		if err != nil {
			t.Fatal(err)
		}
		fds = fds[:0]
		for _, e := range ents {
			fds = append(fds, e.Name())
		}
		if strings.Join(fds, ",") == "0,1,2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job fds %v for 10 s, want 0,1,2", fds)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for fd, want := range map[string]string{"1": "stdout.log", "2": "stderr.log"} {
		got, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", rec.PID, fd))
		if got != filepath.Join(r.Dir(), want) {
			t.Errorf("fd %s is %s, want the run's %s", fd, got, want)
		}
	}
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	c.Wait(t)
	r.AssertGroupEmpty(t)
}

// INT and HUP to the wrapper cancel with their own cause and code;
// --on-hangup ignore keeps the job on HUP (journaled), until a TERM.
func TestRunSignalCauses(t *testing.T) {
	root := runtest.NewRoot(t)
	for _, tc := range []struct {
		sig   unix.Signal
		cause string
		code  int
	}{{unix.SIGINT, statusfile.CauseINT, 130}, {unix.SIGHUP, statusfile.CauseHUP, 129}} {
		id := "sig-" + tc.cause[len("signal:"):]
		c, r := startRun(t, root, id, id, "--", "sleep", "300")
		rec := r.WaitState(t, statusfile.Running)
		unix.Kill(rec.WrapperPID, tc.sig)
		if code := c.Wait(t); code != tc.code {
			t.Fatalf("%s: exit %d, want %d", tc.cause, code, tc.code)
		}
		r.AssertGroupEmpty(t)
		if rec := r.MustStatus(t); rec.State != statusfile.Cancelled || rec.Cause != tc.cause || rec.Code() != tc.code {
			t.Fatalf("%s: state %s cause %s code %d", tc.cause, rec.State, rec.Cause, rec.Code())
		}
	}
	c, r := startRun(t, root, "hup-ignored", "--on-hangup", "ignore", "hup-ignored", "--", "sleep", "300")
	rec := r.WaitState(t, statusfile.Running)
	unix.Kill(rec.WrapperPID, unix.SIGHUP)
	runtest.Eventually(t, "hangup_ignored in the journal", func() bool {
		return strings.Contains(r.File("events.jsonl"), `"event":"hangup_ignored"`)
	})
	if c.Exited() || !proc.Alive(rec.PID, rec.LeaderStart) {
		t.Fatal("the job did not survive an ignored hangup")
	}
	unix.Kill(rec.WrapperPID, unix.SIGTERM)
	if code := c.Wait(t); code != 143 {
		t.Fatalf("exit %d", code)
	}
	r.AssertGroupEmpty(t)
}

// The stream closes (the reader goes away): the wrapper does not die of
// SIGPIPE, journals stream_lost, and the job runs to its own end with every
// byte in stdout.log.
func TestRunStreamLostJobUnaffected(t *testing.T) {
	root := runtest.NewRoot(t)
	r := runtest.Run{Root: root, ID: "pipe"}
	t.Cleanup(r.Kill)
	cmd := exec.Command(runtest.Binary(t), "--root", root, "run", "pipe", "--",
		"sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; sleep 1; echo done")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := out.Read(buf); err != nil {
		t.Fatal(err)
	}
	out.Close() // the controller's end of the stream is gone
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(runtest.Patience):
		t.Fatal("wrapper did not finish")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("wrapper exit %d (%v), want the job's 0", code, cmd.ProcessState)
	}
	log := r.File("stdout.log")
	if !strings.HasPrefix(log, "line 0\n") || !strings.HasSuffix(log, "line 1999\ndone\n") || strings.Count(log, "\n") != 2001 {
		t.Fatalf("stdout.log incomplete: %d lines", strings.Count(log, "\n"))
	}
	if !strings.Contains(r.File("events.jsonl"), `"event":"stream_lost"`) {
		t.Fatalf("no stream_lost: %v", r.Events(t))
	}
	if rec := r.MustStatus(t); rec.State != statusfile.Finished || rec.Code() != 0 {
		t.Fatalf("state %s code %d", rec.State, rec.Code())
	}
}

// The followers (the wrapper's stream and `logs -f`) watch with one-shot
// inotify watches, so a job writing in many small writes pays for one event
// per wake-up, not one per write; each must re-arm its watch, or output
// after an idle spell would wait for the slow backstop. While the job is
// blocked after its first line, both processes hold an armed one-shot
// IN_MODIFY watch (read from /proc/PID/fdinfo), and the line written after
// the idle spell reaches both, byte for byte. `wait` watches only for the
// record's replacement (IN_MOVED_TO), so the job's writes never wake it.
func TestStreamWatchRearmedAfterIdle(t *testing.T) {
	t.Parallel() // waits on processes, leases and graces, not the CPU
	root := runtest.NewRoot(t)
	r := runtest.Run{Root: root, ID: "idle"}
	t.Cleanup(r.Kill)
	fifo := filepath.Join(t.TempDir(), "go")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(runtest.Binary(t), "--root", root, "run", "--lease", "0", "idle", "--",
		"sh", "-c", `echo first; read x < "$0"; echo "second $x"`, fifo)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var streamed bytes.Buffer
	readDone := make(chan error, 1)
	firstSeen := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		seen := false
		for {
			n, err := out.Read(buf)
			streamed.Write(buf[:n])
			if !seen && strings.Contains(streamed.String(), "first\n") {
				seen = true
				close(firstSeen)
			}
			if err != nil {
				readDone <- err
				return
			}
		}
	}()
	select {
	case <-firstSeen:
	case <-time.After(runtest.Patience):
		t.Fatal("the first line was never streamed")
	}
	logs := runtest.Start(t, root, "logs", "-f", "idle")
	runtest.Eventually(t, "logs -f printed the first line", func() bool {
		return strings.Contains(logs.Stdout.String(), "first\n")
	})

	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(r.Dir(), "stdout.log"), &st); err != nil {
		t.Fatal(err)
	}
	var dir unix.Stat_t
	if err := unix.Stat(r.Dir(), &dir); err != nil {
		t.Fatal(err)
	}
	// The wrapper watches stdout.log itself; logs -f watches the run
	// directory (file and record changes alike).
	runtest.Eventually(t, "the wrapper holds an armed one-shot watch on stdout.log", func() bool {
		return hasOneShotWatch(cmd.Process.Pid, st.Ino)
	})
	runtest.Eventually(t, "logs -f holds an armed one-shot watch on the run directory", func() bool {
		return hasOneShotWatch(logs.Process.Pid, dir.Ino)
	})
	wait := runtest.Start(t, root, "wait", "idle")
	runtest.Eventually(t, "wait holds a one-shot watch for the record only", func() bool {
		m, ok := watchMask(wait.Process.Pid, dir.Ino)
		return ok && m&unix.IN_ONESHOT != 0 && m&unix.IN_MOVED_TO != 0 && m&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) == 0
	})

	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(w, "after-idle")
	w.Close()
	select {
	case <-readDone:
	case <-time.After(runtest.Patience):
		t.Fatal("the stream never ended")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("wrapper: %v", err)
	}
	want := "first\nsecond after-idle\n"
	if streamed.String() != want || r.File("stdout.log") != want {
		t.Fatalf("streamed %q, stdout.log %q; want %q", streamed.String(), r.File("stdout.log"), want)
	}
	if code := logs.Wait(t); code != 0 || logs.Stdout.String() != want {
		t.Fatalf("logs -f: exit %d, printed %q; want 0, %q", code, logs.Stdout.String(), want)
	}
	if code := wait.Wait(t); code != 0 {
		t.Fatalf("wait: exit %d, want the job's 0\n%s", code, wait.Stderr.String())
	}
}

// hasOneShotWatch reports whether process pid holds an inotify watch on
// inode ino that is one-shot and includes IN_MODIFY.
func hasOneShotWatch(pid int, ino uint64) bool {
	m, ok := watchMask(pid, ino)
	return ok && m&unix.IN_ONESHOT != 0 && m&unix.IN_MODIFY != 0
}

// watchMask returns the mask of process pid's inotify watch on inode ino,
// from its fdinfo ("inotify wd:1 ino:1a2b sdev:fd00001 mask:80000002 ...",
// hex fields).
func watchMask(pid int, ino uint64) (uint64, bool) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fdinfo", pid))
	if err != nil {
		return 0, false
	}
	for _, fd := range fds {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "inotify ") {
				continue
			}
			var wino, mask uint64
			for _, f := range strings.Fields(line) {
				k, v, _ := strings.Cut(f, ":")
				switch k {
				case "ino":
					wino, _ = strconv.ParseUint(v, 16, 64)
				case "mask":
					mask, _ = strconv.ParseUint(v, 16, 64)
				}
			}
			if wino == ino {
				return mask, true
			}
		}
	}
	return 0, false
}
