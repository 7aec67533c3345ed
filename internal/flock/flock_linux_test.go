package flock_test

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/flock"
)

// patience bounds every wait on a condition: generous, for a loaded host.
const patience = 60 * time.Second

// open opens path afresh: flock(2) locks belong to an open file, so two
// opens of one file contend as two processes would.
func open(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// held reports whether path's lock is held by another open file: a fresh
// open cannot take it exclusively.
func held(t *testing.T, path string) bool {
	t.Helper()
	f := open(t, path)
	defer f.Close()
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return false
	}
	if err != unix.EWOULDBLOCK {
		t.Fatalf("probe %s: %v", path, err)
	}
	return true
}

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, patience)
		}
		time.Sleep(time.Millisecond)
	}
}

// inFlock reports whether thread tid of this process is blocked in
// flock(2), from /proc/self/task/TID/syscall (the number of the system
// call it waits in, first).
func inFlock(tid int) bool {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/syscall")
	if err != nil {
		return false
	}
	nr, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	return nr == strconv.Itoa(unix.SYS_FLOCK)
}

// TestLockWaitsThroughSignals blocks Lock on a lock another open file
// holds, signals the very thread waiting in flock(2) again and again (the
// interruption that is EINTR to a handler without SA_RESTART), and
// requires Lock to come back only once the holder lets go, with the lock
// held.
func TestLockWaitsThroughSignals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	holder := open(t, path)
	if err := flock.Lock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	usr1 := make(chan os.Signal, 16)
	signal.Notify(usr1, unix.SIGUSR1)
	defer signal.Stop(usr1)

	waiter := open(t, path)
	tidc := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread stays the one signalled; it ends with the goroutine
		tidc <- unix.Gettid()
		done <- flock.Lock(int(waiter.Fd()), unix.LOCK_EX)
	}()
	tid := <-tidc
	waitFor(t, "the waiter blocked in flock(2)", func() bool { return inFlock(tid) })
	for i := 0; i < 5; i++ {
		if err := unix.Tgkill(os.Getpid(), tid, unix.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-usr1:
		case <-time.After(patience):
			t.Fatal("SIGUSR1 not delivered")
		}
		waitFor(t, "the waiter back in flock(2) after the signal", func() bool { return inFlock(tid) })
		select {
		case err := <-done:
			t.Fatalf("Lock returned %v while the lock was held elsewhere (after signal %d)", err, i+1)
		default:
		}
	}
	if err := holder.Close(); err != nil { // lets go
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
	case <-time.After(patience):
		t.Fatal("Lock did not return once the holder let go")
	}
	if !held(t, path) {
		t.Fatal("Lock returned nil without the lock held")
	}
}

// TestLockNonBlocking checks the single try: EWOULDBLOCK while another
// open file holds the lock, the lock once it is free.
func TestLockNonBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	holder := open(t, path)
	if err := flock.Lock(int(holder.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	f := open(t, path)
	if err := flock.Lock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("exclusive try on a shared-held lock: %v, want EWOULDBLOCK", err)
	}
	if err := flock.Lock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		t.Fatalf("shared try beside a shared holder: %v", err)
	}
	flock.Lock(int(f.Fd()), unix.LOCK_UN)
	flock.Lock(int(holder.Fd()), unix.LOCK_UN)
	if err := flock.Lock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("exclusive try on a free lock: %v", err)
	}
}

// TestPoll checks the wait a context ends: busy until the deadline (the
// context's error, having tried), at once when the context is already
// done and the lock is free, cancelled while waiting, and taken once the
// holder lets go mid-wait.
func TestPoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	holder := open(t, path)
	if err := flock.Lock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	f := open(t, path)
	fd := int(f.Fd())

	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		begin := time.Now()
		err := flock.Poll(ctx, fd, unix.LOCK_EX, 5*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Poll on a held lock: %v, want the deadline", err)
		}
		if waited := time.Since(begin); waited < 30*time.Millisecond {
			t.Fatalf("Poll gave up after %v, before its 30ms deadline", waited)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- flock.Poll(ctx, fd, unix.LOCK_EX, 5*time.Millisecond) }()
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Poll: %v", err)
			}
		case <-time.After(patience):
			t.Fatal("Poll did not end with its context")
		}
	})
	t.Run("released", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- flock.Poll(context.Background(), fd, unix.LOCK_EX, 5*time.Millisecond) }()
		holder.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Poll: %v", err)
			}
		case <-time.After(patience):
			t.Fatal("Poll did not take the lock once the holder let go")
		}
		if !held(t, path) {
			t.Fatal("Poll returned nil without the lock held")
		}
		flock.Lock(fd, unix.LOCK_UN)
	})
	t.Run("done-but-free", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := flock.Poll(ctx, fd, unix.LOCK_EX, 5*time.Millisecond); err != nil {
			t.Fatalf("Poll with an ended context on a free lock: %v, want it taken (one try)", err)
		}
		flock.Lock(fd, unix.LOCK_UN)
	})
}
