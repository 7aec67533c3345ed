package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func applyOut(t *testing.T, p *Plan, dest string, dry bool) (int, string) {
	t.Helper()
	var b strings.Builder
	n, err := p.Apply(&b, dest, dry)
	if err != nil {
		t.Fatalf("Apply: %v\n%s", err, b.String())
	}
	return n, b.String()
}

func lines(prefix string, paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		b.WriteString(prefix + ": " + p + "\n")
	}
	return b.String()
}

// TestApply: dry run writes nothing, a first run installs everything, a
// second changes nothing and says so, a changed file is updated alone, and
// modes are exact whatever the umask.
func TestApply(t *testing.T) {
	old := syscall.Umask(0o027)
	defer syscall.Umask(old)

	dest := t.TempDir()
	p, err := NewPlan(Options{Method: Cron, User: true, Home: "/home/al", RunRoot: "/home/al/.agent-runs", Executable: fakeBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{"/home/al/.local/bin/agent-wrap", "/home/al/.local/state/agent-wrap", "/home/al/.config/agent-wrap/watchdog.crontab"}

	t.Run("dry-run", func(t *testing.T) {
		n, out := applyOut(t, p, dest, true)
		want := "would install: " + paths[0] + "\nwould create: " + paths[1] + "\nwould install: " + paths[2] + "\n"
		if n != 3 || out != want {
			t.Errorf("dry run: %d changes, output\n%s\nwant 3 and\n%s", n, out, want)
		}
		if ents, _ := os.ReadDir(dest); len(ents) != 0 {
			t.Errorf("dry run wrote %v", ents)
		}
	})
	t.Run("first", func(t *testing.T) {
		n, out := applyOut(t, p, dest, false)
		want := "installed: " + paths[0] + "\ncreated: " + paths[1] + "\ninstalled: " + paths[2] + "\n"
		if n != 3 || out != want {
			t.Errorf("first run: %d changes, output\n%s\nwant 3 and\n%s", n, out, want)
		}
	})
	t.Run("perm0755-0700-0600/umask0027", func(t *testing.T) {
		for i, want := range []os.FileMode{0o755, 0o700, 0o600} {
			fi, err := os.Stat(filepath.Join(dest, paths[i]))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s: mode %v, want %v", paths[i], fi.Mode().Perm(), want)
			}
		}
	})
	t.Run("second-unchanged", func(t *testing.T) {
		n, out := applyOut(t, p, dest, false)
		if want := lines("unchanged", paths...); n != 0 || out != want {
			t.Errorf("second run: %d changes, output\n%s\nwant 0 and\n%s", n, out, want)
		}
	})
	t.Run("one-file-changed", func(t *testing.T) {
		cron := filepath.Join(dest, paths[2])
		if err := os.WriteFile(cron, []byte("edited\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		n, out := applyOut(t, p, dest, false)
		want := "unchanged: " + paths[0] + "\nunchanged: " + paths[1] + "\nupdated: " + paths[2] + "\n"
		if n != 1 || out != want {
			t.Errorf("after an edit: %d changes, output\n%s\nwant 1 and\n%s", n, out, want)
		}
		if b, _ := os.ReadFile(cron); string(b) != string(p.Files[2].Data) {
			t.Errorf("crontab file not restored: %q", b)
		}
	})
	t.Run("mode-changed", func(t *testing.T) {
		bin := filepath.Join(dest, paths[0])
		if err := os.Chmod(bin, 0o777); err != nil {
			t.Fatal(err)
		}
		if n, out := applyOut(t, p, dest, false); n != 1 || !strings.HasPrefix(out, "updated: "+paths[0]+"\n") {
			t.Errorf("after a chmod: %d changes, output\n%s", n, out)
		}
		if fi, _ := os.Stat(bin); fi.Mode().Perm() != 0o755 {
			t.Errorf("mode %v, want 0755", fi.Mode().Perm())
		}
	})
	t.Run("no-temp-files-left", func(t *testing.T) {
		for _, d := range []string{filepath.Dir(paths[0]), filepath.Dir(paths[2])} {
			ents, err := os.ReadDir(filepath.Join(dest, d))
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 1 {
				t.Errorf("%s holds %v, want only the installed file", d, ents)
			}
		}
	})
}

// TestApplySymlinkReplaced: a symlink where a file goes is replaced by the
// file, never written through.
func TestApplySymlinkReplaced(t *testing.T) {
	dest := t.TempDir()
	p, err := NewPlan(Options{Method: Cron, UserName: "root", RunRoot: "/r", Executable: fakeBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dest, "etc/cron.d/agent-wrap")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if _, out := applyOut(t, p, dest, false); !strings.Contains(out, "updated: /etc/cron.d/agent-wrap\n") {
		t.Errorf("output:\n%s", out)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep\n" {
		t.Errorf("wrote through the symlink: %q", b)
	}
	if fi, _ := os.Lstat(link); !fi.Mode().IsRegular() {
		t.Errorf("%s is %v, want a regular file", link, fi.Mode())
	}
}
