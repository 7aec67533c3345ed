package ledger

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/rundir"
)

var bg = context.Background()

func TestCreateUpdateRead(t *testing.T) {
	eachBackend(t, func(t *testing.T, l Store) {
		files, _ := l.(*Ledger)
		if files != nil {
			st, err := os.Stat(files.Path)
			if err != nil || st.Mode().Perm() != 0o700 {
				t.Fatalf("ledger dir mode %v (%v), want 0700", st.Mode(), err)
			}
		}
		me := &Owner{Host: "h1", BootID: "b", PID: 10, Start: 5}
		r := &Record{RunID: "r1", Dest: "h", State: Launching, Command: []string{"a", ""}, Controller: me, ControllerPID: 10, CreatedAt: time.Now().UTC()}
		if err := l.Create(bg, r); err != nil {
			t.Fatal(err)
		}
		if files != nil {
			fi, err := os.Stat(filepath.Join(files.Path, "r1.json"))
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("record mode %v (%v), want 0600", fi.Mode(), err)
			}
		}
		got, err := l.Read(bg, "r1")
		if err != nil || got.State != Launching || got.HeartbeatAt.IsZero() || got.Controller == nil || *got.Controller != *me {
			t.Fatalf("read back the launching record: %+v, %v", got, err)
		}
		code := 3
		r.State, r.Outcome, r.ExitCode = Settled, Completed, &code
		if err := l.Update(bg, r); err != nil {
			t.Fatal(err)
		}
		got, err = l.Read(bg, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != Settled || got.Code() != 3 || len(got.Command) != 2 || got.Command[1] != "" || got.Schema != 1 {
			t.Errorf("read back %+v", got)
		}
		if files != nil {
			ents, _ := os.ReadDir(files.Path)
			if len(ents) != 1 {
				t.Errorf("ledger holds %d files, want 1 (no temporary or lock left)", len(ents))
			}
		}
		recs, err := l.List(bg, Filter{})
		if err != nil || len(recs) != 1 || recs[0].RunID != "r1" {
			t.Errorf("List = %v, %v", recs, err)
		}
		if recs, _ := l.List(bg, Filter{Unsettled: true}); len(recs) != 0 {
			t.Errorf("List(unsettled) holds a settled run: %v", recs)
		}
		if err := l.Update(bg, &Record{RunID: "none", State: Running}); err == nil {
			t.Errorf("Update of a run the ledger does not hold succeeded")
		}
	})
}

func TestCreateRefusesExistingID(t *testing.T) {
	eachBackend(t, func(t *testing.T, l Store) {
		if err := l.Create(bg, &Record{RunID: "dup", Dest: "first", State: Launching}); err != nil {
			t.Fatal(err)
		}
		err := l.Create(bg, &Record{RunID: "dup", Dest: "second", State: Launching})
		if !errors.Is(err, ErrExists) {
			t.Fatalf("second Create: %v, want ErrExists", err)
		}
		if r, _ := l.Read(bg, "dup"); r.Dest != "first" {
			t.Errorf("the first record was changed: %+v", r)
		}
		if _, err := l.Read(bg, "none"); !errors.Is(err, ErrNoRecord) {
			t.Errorf("missing: %v", err)
		}
		if _, err := l.Read(bg, "../x"); !errors.Is(err, rundir.ErrBadID) {
			t.Errorf("bad ID: %v", err)
		}
	})
}

// A settle's write under its claim stands: the owner's later Update is
// ErrLost and changes nothing.
func TestLateOwnerCannotOverwrite(t *testing.T) {
	eachBackend(t, func(t *testing.T, l Store) {
		owner := &Owner{Host: "a", BootID: "b1", PID: 1, Start: 2}
		r := &Record{RunID: "late", State: Running, Controller: owner, ControllerPID: 1, ControllerStart: 2}
		if err := l.Create(bg, r); err != nil {
			t.Fatal(err)
		}
		c, err := l.Claim(bg, "late")
		if err != nil {
			t.Fatal(err)
		}
		s := *c.Record
		s.MarkSettled(Completed, 7, "", "")
		s.SettledBy = &Owner{Host: "b", PID: 9}
		if err := c.Settle(bg, &s); err != nil {
			t.Fatal(err)
		}
		r.MarkSettled(Unknown, -1, "", "the owner's own guess")
		err = l.Update(bg, r)
		if !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "b:9") {
			t.Fatalf("late owner's Update: %v, want ErrLost naming the settle b:9", err)
		}
		got, _ := l.Read(bg, "late")
		if got.Outcome != Completed || got.Code() != 7 || got.SettledBy == nil {
			t.Errorf("the settled outcome was overwritten: %+v", got)
		}
	})
}

// A claim excludes a second one until it ends; an owner's Update waits for
// the claim and then lands if it was released.
func TestClaimIsExclusive(t *testing.T) {
	eachBackend(t, func(t *testing.T, l Store) {
		r := &Record{RunID: "c1", State: Running, ControllerPID: 1}
		if err := l.Create(bg, r); err != nil {
			t.Fatal(err)
		}
		c, err := l.Claim(bg, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Claim(bg, "c1"); !errors.Is(err, ErrBusy) {
			t.Fatalf("second claim: %v, want ErrBusy", err)
		}
		if _, err := l.Claim(bg, "none"); !errors.Is(err, ErrNoRecord) {
			t.Errorf("claim of a missing run: %v, want ErrNoRecord", err)
		}
		wrote := make(chan error, 1)
		go func() {
			r.State = Detached
			wrote <- l.Update(bg, r)
		}()
		select {
		case err := <-wrote:
			t.Fatalf("the owner's Update did not wait for the claim: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		c.Release()
		if err := <-wrote; err != nil {
			t.Fatalf("Update after the claim was released: %v", err)
		}
		c2, err := l.Claim(bg, "c1")
		if err != nil {
			t.Fatalf("claim after release: %v", err)
		}
		c2.Release()
		if got, _ := l.Read(bg, "c1"); got.State != Detached {
			t.Errorf("state %s, want detached", got.State)
		}
	})
}

func TestHeartbeat(t *testing.T) {
	eachBackend(t, func(t *testing.T, l Store) {
		me := &Owner{Host: "h", BootID: "b", PID: 3, Start: 4}
		other := &Owner{Host: "h", BootID: "b", PID: 5, Start: 6}
		for _, id := range []string{"h1", "h2", "h3"} {
			o := me
			if id == "h3" {
				o = other
			}
			if err := l.Create(bg, &Record{RunID: id, State: Running, Controller: o, ControllerPID: o.PID, ControllerStart: o.Start}); err != nil {
				t.Fatal(err)
			}
		}
		before := map[string]time.Time{}
		for _, id := range []string{"h1", "h2", "h3"} {
			r, _ := l.Read(bg, id)
			before[id] = r.HeartbeatAt
		}
		time.Sleep(20 * time.Millisecond)
		if err := l.Heartbeat(bg, me, []string{"h1", "h2", "h3"}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"h1", "h2", "h3"} {
			r, _ := l.Read(bg, id)
			moved := r.HeartbeatAt.After(before[id])
			if moved != (id != "h3") {
				t.Errorf("%s: heartbeat %v -> %v (moved %v); only my runs' should move", id, before[id], r.HeartbeatAt, moved)
			}
		}
		recs, _ := l.List(bg, Filter{Controller: "h:5"})
		if len(recs) != 1 || recs[0].RunID != "h3" {
			t.Errorf("List --controller h:5 = %v", recs)
		}
		if recs, _ := l.List(bg, Filter{Controller: "h"}); len(recs) != 3 {
			t.Errorf("List --controller h = %d runs, want 3", len(recs))
		}
	})
}

func TestOwnerGone(t *testing.T) {
	now := time.Now()
	self := &Owner{Host: "b", BootID: "boot-b", PID: 100, Start: 1}
	alive := func(pid int, start uint64) bool { return pid == 42 && start == 7 }
	here := &Owner{Host: "b", BootID: "boot-b", PID: 42, Start: 7}
	there := &Owner{Host: "a", BootID: "boot-a", PID: 42, Start: 7}
	for _, tc := range []struct {
		name string
		r    Record
		want bool
	}{
		{"settled", Record{State: Settled, ControllerPID: 42}, true},
		{"released", Record{State: Detached, Controller: there}, true},
		{"here alive", Record{State: Running, Controller: here, ControllerPID: 42, ControllerStart: 7}, false},
		{"here dead", Record{State: Running, Controller: here, ControllerPID: 42, ControllerStart: 8}, true},
		{"legacy alive", Record{State: Running, ControllerPID: 42, ControllerStart: 7}, false},
		{"elsewhere fresh", Record{State: Running, Controller: there, ControllerPID: 42, HeartbeatAt: now.Add(-5 * time.Second), GiveUp: 10}, false},
		{"elsewhere stale", Record{State: Running, Controller: there, ControllerPID: 42, HeartbeatAt: now.Add(-11 * time.Second), GiveUp: 10}, true},
		{"elsewhere default give-up", Record{State: Running, Controller: there, ControllerPID: 42, HeartbeatAt: now.Add(-40 * time.Second), Lease: 5, Grace: 1}, true},
		{"this process", Record{State: Running, Controller: self, ControllerPID: 100, ControllerStart: 1}, true},
		// A frozen owner is gone: alive on this machine, but its heartbeat
		// is older than the give-up time (and only then).
		{"here alive, heartbeat fresh", Record{State: Running, Controller: here, ControllerPID: 42, ControllerStart: 7, HeartbeatAt: now.Add(-5 * time.Second), GiveUp: 10}, false},
		{"here alive, heartbeat stale", Record{State: Running, Controller: here, ControllerPID: 42, ControllerStart: 7, HeartbeatAt: now.Add(-11 * time.Second), GiveUp: 10}, true},
		{"here alive, last write stale", Record{State: Running, Controller: here, ControllerPID: 42, ControllerStart: 7, UpdatedAt: now.Add(-40 * time.Second), Lease: 5, Grace: 1}, true},
		{"legacy alive, last write stale", Record{State: Running, ControllerPID: 42, ControllerStart: 7, UpdatedAt: now.Add(-time.Hour)}, false},
	} {
		if got := OwnerGone(&tc.r, self, now, alive); got != tc.want {
			t.Errorf("%s: OwnerGone = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestUnsafe(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "open")
	os.Mkdir(dir, 0o700)
	os.Chmod(dir, 0o777)
	if _, err := OpenFiles(dir, true); !errors.Is(err, rundir.ErrUnsafe) {
		t.Errorf("world-writable ledger: %v, want ErrUnsafe", err)
	}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(t.TempDir(), "theirs")
		os.Mkdir(theirs, 0o700)
		os.Chown(theirs, 65534, 65534)
		if _, err := OpenFiles(theirs, false); !errors.Is(err, rundir.ErrUnsafe) {
			t.Errorf("a ledger owned by someone else: %v, want ErrUnsafe", err)
		}
	}
	l := open(t)
	os.Symlink("/etc/passwd", filepath.Join(l.Path, "sym.json"))
	if _, err := l.Read(bg, "sym"); !errors.Is(err, rundir.ErrUnsafe) {
		t.Errorf("symlinked record: %v, want ErrUnsafe", err)
	}
	if _, err := l.List(bg, Filter{}); err == nil || !errors.Is(err, rundir.ErrUnsafe) {
		t.Errorf("List with a symlinked record: %v, want it named", err)
	}
}

func TestNewID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := NewID()
		if len(id) != 26 || rundir.ValidID(id) != nil || seen[id] {
			t.Fatalf("NewID = %q (len %d, dup %v)", id, len(id), seen[id])
		}
		seen[id] = true
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HOME": "/home/u"}
	get := func(k string) string { return env[k] }
	for _, tc := range []struct{ flag, ledger, xdg, want string }{
		{"/f", "/l", "/x", "/f"},
		{"", "/l", "/x", "/l"},
		{"", "", "/x", "/x/agent-wrap/ledger"},
		{"", "", "", "/home/u/.local/state/agent-wrap/ledger"},
		{"", "postgres://u@db/x", "/x", "postgres://u@db/x"},
		{"postgresql://u@db/x", "/l", "", "postgresql://u@db/x"},
	} {
		env["AGENT_WRAP_LEDGER"], env["XDG_STATE_HOME"] = tc.ledger, tc.xdg
		if got, _ := Resolve(tc.flag, get); got != tc.want {
			t.Errorf("Resolve(%q) with %v = %q, want %q", tc.flag, env, got, tc.want)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:s3cret@db:5432/x?sslmode=require":     "postgres://u:xxxxx@db:5432/x?sslmode=require",
		"postgres://u@db/x?password=s3cret&sslmode=disable": "postgres://u@db/x?password=xxxxx&sslmode=disable",
		"postgresql://u:s3cret@h1,h2/x":                     "postgresql://u:xxxxx@h1,h2/x",
		"/var/lib/ledger":                                   "/var/lib/ledger",
	} {
		if got := Redact(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
