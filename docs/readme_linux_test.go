package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/proc"
)

// readmeCommand is one command of a runnable README.md block: the line it
// stands on and the exit code its comment promises (0 when it names none).
type readmeCommand struct {
	line int
	text string
	want int
}

// exitInComment is a comment's promise of an exit code: "# ... exit 124".
var exitInComment = regexp.MustCompile(`\bexit (\d+)\b`)

// readmeCommands returns the commands of every block of README.md fenced
// as "```sh" (exactly: "```sh no-run" and other languages are not run), in
// order. A runnable block holds single-line commands only; anything a
// line-by-line run would misread is an error naming the line.
func readmeCommands(b []byte) ([]readmeCommand, error) {
	var cmds []readmeCommand
	in, runnable := false, false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			if in {
				in = false
				continue
			}
			in, runnable = true, strings.TrimSpace(strings.TrimPrefix(line, "```")) == "sh"
			continue
		}
		trimmed := strings.TrimSpace(line)
		if !in || !runnable || trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			return nil, fmt.Errorf("README.md:%d: a continuation line in a runnable block; write one command per line, or fence the block ```sh no-run", n)
		}
		switch strings.Fields(trimmed)[0] {
		case "for", "while", "until", "if", "do", "done", "then", "fi", "case", "esac":
			return nil, fmt.Errorf("README.md:%d: a compound command in a runnable block; write one command per line, or fence the block ```sh no-run", n)
		}
		c := readmeCommand{line: n, text: trimmed}
		// The comment is the text after the last " #" that no quote follows.
		if i := strings.LastIndex(line, " #"); i >= 0 && !strings.ContainsAny(line[i:], `'"`) {
			if m := exitInComment.FindStringSubmatch(line[i:]); m != nil {
				c.want, _ = strconv.Atoi(m[1])
			}
		}
		cmds = append(cmds, c)
	}
	if in {
		return nil, fmt.Errorf("README.md: a code block is not closed")
	}
	return cmds, sc.Err()
}

// The parser takes exactly the blocks fenced ```sh, promises an exit code
// only from a comment, and refuses what a line-by-line run would misread.
func TestReadmeCommandsParse(t *testing.T) {
	doc := "```sh\nmake demo\n# a comment\nx --lease 3s a -- sleep 60   # stopped: exit 124\n" +
		"sh -c 'exit 3'\n```\n```sh no-run\nmake test\n```\n```text\nexit 9\n```\n"
	got, err := readmeCommands([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []readmeCommand{{2, "make demo", 0}, {4, "x --lease 3s a -- sleep 60   # stopped: exit 124", 124}, {5, "sh -c 'exit 3'", 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"```sh\na \\\n b\n```\n", "```sh\nwhile true; do x; done\n```\n", "```sh\nmake demo\n"} {
		if _, err := readmeCommands([]byte(bad)); err == nil {
			t.Errorf("%q: no error, want one", bad)
		}
	}
}

// TestReadmeRuns runs README.md's runnable shell blocks as written, as a
// reader would from a clean clone: in a copy of the tree, in one shell, in
// order, each command checked against the exit code the README gives it.
// Every run they start must end decided (reconcile --all exits 0), and no
// process they started may outlive them: the test is a subreaper, so
// anything left behind is its child and is named.
func TestReadmeRuns(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := readmeCommands(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) == 0 || cmds[0].text != "make demo" {
		t.Fatalf("README.md's first runnable command is %v, want make demo (the front door builds and runs a real job)", cmds)
	}

	tree := filepath.Join(t.TempDir(), "agent-wrap")
	copyTree(t, "..", tree)
	root := t.TempDir()

	var script strings.Builder
	script.WriteString("cd " + strconv.Quote(tree) + " || exit 1\n")
	for _, c := range cmds {
		fmt.Fprintf(&script, "%s\nrc=$?; if [ $rc -ne %d ]; then echo \"README.md:%d: exit $rc, the README says %d: \"%s >&2; exit 1; fi\n",
			c.text, c.want, c.line, c.want, shellQuote(c.text))
	}

	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

	cmd := exec.Command("bash", "-c", script.String())
	// A reader's shell: no make of ours around it (under make test, its
	// MAKEFLAGS would name a jobserver this shell does not have).
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" && k != "AGENT_WRAP_ROOT" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "AGENT_WRAP_ROOT="+root)
	out, err := cmd.CombinedOutput()
	t.Logf("README.md's blocks:\n%s", out)
	if err != nil {
		t.Errorf("README.md's blocks: %v", err)
	}
	defer leftBehind(t)

	if err != nil {
		return
	}
	rec := exec.Command(filepath.Join(tree, "bin", "agent-wrap"), "reconcile", "--all")
	rec.Env = cmd.Env
	if out, err := rec.CombinedOutput(); err != nil {
		t.Errorf("after README.md's blocks, reconcile --all: %v\n%s", err, out)
	}
}

// leftBehind fails the test for every live process the README's commands
// left (reparented to the test, a subreaper), KILLs it by its PID (safe:
// until it is reaped, the PID is this test's child and cannot be reused),
// and reaps them all.
func leftBehind(t *testing.T) {
	t.Helper()
	ds, err := proc.Descendants(os.Getpid())
	if err != nil {
		t.Errorf("descendants of the test: %v", err)
	}
	for _, d := range ds {
		if d.State == 'Z' {
			continue
		}
		argv, _ := proc.Cmdline(d.PID)
		t.Errorf("pid %d (%s) outlived README.md's commands", d.PID, strings.Join(argv, " "))
		unix.Kill(d.PID, unix.SIGKILL)
	}
	for {
		var ws unix.WaitStatus
		if pid, err := unix.Wait4(-1, &ws, 0, nil); pid <= 0 || err != nil {
			return
		}
	}
}

// copyTree copies the source tree at src to dst as a clean clone has it:
// without .git and without what the build writes (bin/, dist/).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		switch {
		case rel == ".git" && d.IsDir(), d.IsDir() && (rel == "bin" || rel == "dist"):
			return filepath.SkipDir
		case rel == ".git":
			return nil // a worktree's .git is a file naming the repository
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(l, to)
		case d.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("copying the tree: %v", err)
	}
}

// shellQuote quotes s as one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
