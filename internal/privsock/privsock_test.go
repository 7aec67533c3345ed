//go:build linux || darwin || freebsd

package privsock_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/privsock"
)

// TestDir: a new directory is made 0700; one open to group, a symlink to
// a private one, a file and a directory of another user are refused, each
// named with what is wrong.
func TestDir(t *testing.T) {
	d := filepath.Join(t.TempDir(), "sockets")
	if err := privsock.Dir(d); err != nil {
		t.Fatalf("a new directory: %v", err)
	}
	if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v, %v; want a directory with mode 0700", fi, err)
	}
	if err := privsock.Dir(d); err != nil {
		t.Fatalf("the same directory again: %v", err)
	}
	t.Run("group-readable", func(t *testing.T) {
		g := filepath.Join(t.TempDir(), "g")
		os.Mkdir(g, 0o700)
		os.Chmod(g, 0o750)
		if err := privsock.Dir(g); err == nil || !strings.Contains(err.Error(), "0750") {
			t.Errorf("a group-readable directory: %v, want refused naming its mode", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		l := filepath.Join(t.TempDir(), "link")
		os.Symlink(d, l)
		if err := privsock.Dir(l); err == nil || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("a symlink to a private directory: %v, want refused", err)
		}
	})
	t.Run("file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o600)
		if err := privsock.Dir(f); err == nil {
			t.Error("a regular file was accepted")
		}
	})
	t.Run("other-owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Fatal("this test gives a directory to another user: run it as root")
		}
		o := filepath.Join(t.TempDir(), "theirs")
		os.Mkdir(o, 0o700)
		if err := os.Chown(o, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := privsock.Dir(o); err == nil || !strings.Contains(err.Error(), "uid 65534") {
			t.Errorf("another user's directory: %v, want refused naming its owner", err)
		}
	})
}

// TestListen binds a real socket: mode 0600 and a socket, reachable; a
// stale socket at the path is replaced, a regular file is not (and is
// left as it was); a path too long for a socket address is refused with
// nothing made; closing the listener leaves the socket for its owner to
// remove.
func TestListen(t *testing.T) {
	dir := t.TempDir()
	if err := privsock.Dir(filepath.Join(dir, "s")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "s", "a.sock")
	ln, err := privsock.Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bound %v, %v; want a socket with mode 0600", fi, err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		t.Fatalf("socket owned by %v, want uid %d", fi.Sys(), os.Geteuid())
	}
	c, err := net.Dial("unix", p)
	if err != nil {
		t.Fatalf("dial the bound socket: %v", err)
	}
	c.Close()
	ln.Close()
	if _, err := os.Lstat(p); err != nil {
		t.Fatalf("closing the listener removed the socket: %v", err)
	}

	t.Run("stale", func(t *testing.T) {
		// p is now a socket nobody listens on.
		ln, err := privsock.Listen(p)
		if err != nil {
			t.Fatalf("over a stale socket: %v", err)
		}
		defer ln.Close()
		c, err := net.Dial("unix", p)
		if err != nil {
			t.Fatalf("dial the rebound socket: %v", err)
		}
		c.Close()
	})
	t.Run("not-a-socket", func(t *testing.T) {
		f := filepath.Join(dir, "s", "file")
		if err := os.WriteFile(f, []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		if ln, err := privsock.Listen(f); err == nil {
			ln.Close()
			t.Fatal("bound over a regular file")
		}
		if b, err := os.ReadFile(f); err != nil || string(b) != "keep" {
			t.Fatalf("the file is now %q, %v; want it untouched", b, err)
		}
	})
	t.Run("too-long", func(t *testing.T) {
		long := filepath.Join(dir, "s", strings.Repeat("x", privsock.MaxPath)+".sock")
		_, err := privsock.Listen(long)
		if err == nil || !strings.Contains(err.Error(), "longer than a socket address holds") {
			t.Fatalf("a %d-byte path: %v, want refused", len(long), err)
		}
		if _, err := os.Lstat(long); err == nil {
			t.Fatal("a socket was made at the refused path")
		}
	})
	t.Run("at-the-limit", func(t *testing.T) {
		d := filepath.Join(dir, "s")
		if len(d)+2 > privsock.MaxPath {
			t.Fatalf("the test directory %s is too long to build a path at the limit", d)
		}
		name := strings.Repeat("y", privsock.MaxPath-len(d)-1)
		edge := filepath.Join(d, name)
		if len(edge) != privsock.MaxPath {
			t.Fatalf("built a %d-byte path, want %d", len(edge), privsock.MaxPath)
		}
		ln, err := privsock.Listen(edge)
		if err != nil {
			t.Fatalf("a path of exactly MaxPath bytes: %v", err)
		}
		ln.Close()
		os.Remove(edge)
	})
}
