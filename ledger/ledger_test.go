package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-wrap/agent-wrap/rundir"
)

func open(t *testing.T) *Ledger {
	t.Helper()
	l, err := Open(filepath.Join(t.TempDir(), "ledger"), true)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestCreateUpdateRead(t *testing.T) {
	l := open(t)
	st, err := os.Stat(l.Path)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("ledger dir mode %v (%v), want 0700", st.Mode(), err)
	}
	r := &Record{RunID: "r1", Dest: "h", State: Launching, Command: []string{"a", ""}}
	if err := l.Create(r); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(l.Path, "r1.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record mode %v (%v), want 0600", fi.Mode(), err)
	}
	code := 3
	r.State, r.Outcome, r.ExitCode = Settled, Completed, &code
	if err := l.Update(r); err != nil {
		t.Fatal(err)
	}
	got, err := l.Read("r1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != Settled || got.Code() != 3 || len(got.Command) != 2 || got.Schema != 1 {
		t.Errorf("read back %+v", got)
	}
	ents, _ := os.ReadDir(l.Path)
	if len(ents) != 1 {
		t.Errorf("ledger holds %d files, want 1 (no temporary left)", len(ents))
	}
	if ids, _ := l.List(); len(ids) != 1 || ids[0] != "r1" {
		t.Errorf("List = %v", ids)
	}
}

func TestCreateRefusesExistingID(t *testing.T) {
	l := open(t)
	if err := l.Create(&Record{RunID: "dup", Dest: "first"}); err != nil {
		t.Fatal(err)
	}
	err := l.Create(&Record{RunID: "dup", Dest: "second"})
	if !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	if r, _ := l.Read("dup"); r.Dest != "first" {
		t.Errorf("the first record was changed: %+v", r)
	}
}

func TestUnsafe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "open")
	os.Mkdir(dir, 0o700)
	os.Chmod(dir, 0o777)
	if _, err := Open(dir, true); !errors.Is(err, rundir.ErrUnsafe) {
		t.Errorf("world-writable ledger: %v, want ErrUnsafe", err)
	}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(t.TempDir(), "theirs")
		os.Mkdir(theirs, 0o700)
		os.Chown(theirs, 65534, 65534)
		if _, err := Open(theirs, false); !errors.Is(err, rundir.ErrUnsafe) {
			t.Errorf("a ledger owned by someone else: %v, want ErrUnsafe", err)
		}
	}
	l := open(t)
	os.Symlink("/etc/passwd", filepath.Join(l.Path, "sym.json"))
	if _, err := l.Read("sym"); !errors.Is(err, rundir.ErrUnsafe) {
		t.Errorf("symlinked record: %v, want ErrUnsafe", err)
	}
	if _, err := l.Read("../x"); !errors.Is(err, rundir.ErrBadID) {
		t.Errorf("bad ID: %v", err)
	}
	if _, err := l.Read("none"); !errors.Is(err, ErrNoRecord) {
		t.Errorf("missing: %v", err)
	}
}

func TestNewID(t *testing.T) {
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
	env := map[string]string{"HOME": "/home/u"}
	get := func(k string) string { return env[k] }
	for _, tc := range []struct{ flag, ledger, xdg, want string }{
		{"/f", "/l", "/x", "/f"},
		{"", "/l", "/x", "/l"},
		{"", "", "/x", "/x/agent-wrap/ledger"},
		{"", "", "", "/home/u/.local/state/agent-wrap/ledger"},
	} {
		env["AGENT_WRAP_LEDGER"], env["XDG_STATE_HOME"] = tc.ledger, tc.xdg
		if got, _ := Resolve(tc.flag, get); got != tc.want {
			t.Errorf("Resolve(%q) with %v = %q, want %q", tc.flag, env, got, tc.want)
		}
	}
}
