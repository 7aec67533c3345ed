package watchdog_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

// notifySocket is a service manager's end of sd_notify(3): a real unix
// datagram socket, read all the time as systemd reads its own (a sender
// blocks on a full one), and the Notifier aimed at it.
type notifySocket struct {
	t   *testing.T
	n   watchdog.Notifier
	got chan string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &notifySocket{t: t, n: watchdog.Notifier{Socket: name}, got: make(chan string, 1<<14)}
	go func() {
		defer close(s.got)
		buf := make([]byte, 256)
		for {
			n, err := l.Read(buf)
			if err != nil {
				return // closed
			}
			s.got <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { l.Close() })
	return s
}

// recv returns the next notification, failing the test if none comes
// within d.
func (s *notifySocket) recv(d time.Duration) string {
	s.t.Helper()
	select {
	case m := <-s.got:
		return m
	case <-time.After(d):
		s.t.Fatalf("no notification within %v", d)
		return ""
	}
}

// expect fails the test unless the next notification, within the tests'
// patience, is want; what names it in the failure.
func (s *notifySocket) expect(want, what string) {
	s.t.Helper()
	if got := s.recv(runtest.Patience); got != want {
		s.t.Fatalf("%s %q, want %s", what, got, want)
	}
}

// until reads notifications, each of which must be WATCHDOG=1, until want
// arrives.
func (s *notifySocket) until(want string) {
	s.t.Helper()
	for {
		got := s.recv(runtest.Patience)
		if got == want {
			return
		}
		if got != "WATCHDOG=1" {
			s.t.Fatalf("notification %q while waiting for %s", got, want)
		}
	}
}

// next returns the next notification, or false if none comes within d.
func (s *notifySocket) next(d time.Duration) (string, bool) {
	select {
	case m := <-s.got:
		return m, true
	case <-time.After(d):
		return "", false
	}
}

func openRoot(t *testing.T, path string) *rundir.Root {
	t.Helper()
	r, err := rundir.OpenRoot(path, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// serve runs Serve in a goroutine; the returned function cancels its
// context and returns what Serve returned.
func serve(t *testing.T, root *rundir.Root, o watchdog.ServeOptions, sd watchdog.Notifier) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- watchdog.Serve(ctx, root, o, sd) }()
	t.Cleanup(func() { cancel(); <-done })
	return func() error {
		cancel()
		select {
		case err := <-done:
			done <- err // for the cleanup
			return err
		case <-time.After(runtest.Patience):
			t.Fatalf("Serve did not return within %v of its context ending", runtest.Patience)
			return nil
		}
	}
}

// The service over a real run whose wrapper was SIGKILLed: READY=1 first,
// passes every Interval (each followed by WATCHDOG=1) that leave the run
// alone while its lease holds, then, once the lease is ended on demand
// (renew --lease 1s), one JSON line saying it stopped the run, whose group
// is then empty and whose record says cancelled by the lease (124).
// Cancelling the context says STOPPING=1 and returns nil.
func TestServeStopsExpiredRun(t *testing.T) {
	t.Parallel()
	rootPath := runtest.NewRoot(t)
	r := runtest.Run{Root: rootPath, ID: "orphan"}
	t.Cleanup(r.Kill)
	c := runtest.Start(t, rootPath, "run", "--lease", "5m", "--grace", "1s", r.ID, "--", "sh", "-c", "sleep 300 & wait")
	rec := r.WaitState(t, statusfile.Running)
	runtest.Eventually(t, "the group to hold the job and its child", func() bool { return len(runtest.Members(rec.PGID)) == 2 })
	unix.Kill(rec.WrapperPID, unix.SIGKILL) // the watchdog, not the wrapper, must stop it
	c.Wait(t)

	sock := newNotifySocket(t)
	var out, diag runtest.Buffer
	stop := serve(t, openRoot(t, rootPath), watchdog.ServeOptions{Interval: 50 * time.Millisecond, Out: &out, Options: watchdog.Options{Diag: &diag}}, sock.n)
	sock.expect("READY=1", "first notification")
	for i := 0; i < 4; i++ { // passes while the lease holds
		sock.expect("WATCHDOG=1", "notification")
	}
	if out.Len() != 0 || len(runtest.Members(rec.PGID)) != 2 {
		t.Fatalf("the watchdog acted before the deadline: %q, group %v", out.String(), runtest.Members(rec.PGID))
	}

	if code, _, stderr := runtest.Exec(t, rootPath, "renew", "--lease", "1s", r.ID); code != 0 {
		t.Fatalf("renew --lease 1s: exit %d: %s", code, stderr)
	}
	runtest.Eventually(t, "the watchdog to report the stop", func() bool { return strings.HasSuffix(out.String(), "\n") })
	var act watchdog.Action
	if err := json.Unmarshal(out.Bytes(), &act); err != nil || act.RunID != r.ID || act.Action != "stopped" || act.Cause != statusfile.CauseLease {
		t.Fatalf("watchdog output %q (%v), want one line: %s stopped by the lease", out.String(), err, r.ID)
	}
	r.AssertGroupEmpty(t)
	if rec := r.MustStatus(t); rec.State != statusfile.Cancelled || rec.Cause != statusfile.CauseLease || rec.Code() != 124 {
		t.Fatalf("state %s cause %s code %d, want cancelled lease 124", rec.State, rec.Cause, rec.Code())
	}

	if err := stop(); err != nil {
		t.Errorf("Serve = %v after its context ended, want nil", err)
	}
	sock.until("STOPPING=1")
	if lines := strings.Count(out.String(), "\n"); lines != 1 {
		t.Errorf("%d action lines, want 1 (a stopped run is not stopped again):\n%s", lines, out.String())
	}
	if diag.Len() != 0 {
		t.Errorf("diagnostics from a clean service:\n%s", diag.String())
	}
}

// Passes follow the service manager's ping interval when it is shorter
// than Interval: with an hour between passes and WatchdogSec= asking for a
// ping every 50ms, WATCHDOG=1 keeps coming.
func TestServePingsAsOftenAsAsked(t *testing.T) {
	t.Parallel()
	sock := newNotifySocket(t)
	sock.n.WatchdogInterval = 50 * time.Millisecond
	stop := serve(t, openRoot(t, runtest.NewRoot(t)), watchdog.ServeOptions{Interval: time.Hour}, sock.n)
	sock.expect("READY=1", "first notification")
	for i := 0; i < 5; i++ {
		sock.expect("WATCHDOG=1", "notification")
	}
	if err := stop(); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	sock.until("STOPPING=1")
}

// One watchdog per root. While another holds the lock, a --once pass is
// left to it (nil, said on Diag, nothing passed, no notification); a
// service says once that it waits, keeps pinging while it does, takes
// the lock when it is let go and serves; and ended while waiting it
// returns nil without STOPPING=1 (it never started).
func TestServeWaitsForTheLock(t *testing.T) {
	t.Parallel()
	root := openRoot(t, runtest.NewRoot(t))
	unlock, err := root.TryLock(watchdog.LockFile)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("once", func(t *testing.T) {
		sock := newNotifySocket(t)
		var out, diag runtest.Buffer
		err := watchdog.Serve(context.Background(), root, watchdog.ServeOptions{Once: true, Out: &out, Options: watchdog.Options{Diag: &diag}}, sock.n)
		want := "agent-wrap: another watchdog is running for " + root.Path + "; leaving this pass to it\n"
		if err != nil || diag.String() != want || out.Len() != 0 {
			t.Errorf("Serve --once on a held lock = %v, diag %q, out %q; want nil and %q", err, diag.String(), out.String(), want)
		}
		if m, ok := sock.next(100 * time.Millisecond); ok {
			t.Errorf("a --once pass told the service manager %q", m)
		}
	})

	t.Run("ended-while-waiting", func(t *testing.T) {
		sock := newNotifySocket(t)
		var diag runtest.Buffer
		stop := serve(t, root, watchdog.ServeOptions{Interval: time.Hour, Options: watchdog.Options{Diag: &diag}}, sock.n)
		sock.expect("READY=1", "first notification")
		sock.expect("WATCHDOG=1", "notification while waiting")
		if err := stop(); err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
		// Serve has returned: what it sent is on its way already.
		for {
			m, ok := sock.next(100 * time.Millisecond)
			if !ok {
				break
			}
			if m != "WATCHDOG=1" {
				t.Errorf("notification %q from a service ended while waiting, want only WATCHDOG=1", m)
			}
		}
		if want := "agent-wrap: another watchdog is running for " + root.Path + "; waiting for it to finish\n"; diag.String() != want {
			t.Errorf("diag %q, want %q", diag.String(), want)
		}
	})

	t.Run("takes-it-when-let-go", func(t *testing.T) {
		sock := newNotifySocket(t)
		var diag runtest.Buffer
		stop := serve(t, root, watchdog.ServeOptions{Interval: time.Hour, Options: watchdog.Options{Diag: &diag}}, sock.n)
		sock.expect("READY=1", "first notification")
		for i := 0; i < 2; i++ { // a ping a second while it waits
			sock.expect("WATCHDOG=1", "notification while waiting")
		}
		unlock()
		runtest.Eventually(t, "the service to take the lock", func() bool {
			u, err := root.TryLock(watchdog.LockFile)
			if err == nil {
				u()
			}
			return err != nil
		})
		if err := stop(); err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
		sock.until("STOPPING=1")
		sc := bufio.NewScanner(strings.NewReader(diag.String()))
		for n := 0; sc.Scan(); n++ {
			if n > 0 || !strings.HasSuffix(sc.Text(), "; waiting for it to finish") {
				t.Errorf("diag line %d: %q; want the one line saying it waits", n, sc.Text())
			}
		}
	})
}
