// Package docs holds the project's reference documents; its tests keep them
// honest: no link leaves the repository or points at nothing, every command
// agent-wrap registers is documented here, README.md's code map names every
// package, and README.md's shell blocks run as written.
package docs

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/cli"
)

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Every relative link in every Markdown file resolves to a file inside the
// repository: a clone has nothing beside it to link to.
func TestLinksStayInRepo(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range mdLink.FindAllSubmatch(b, -1) {
			target := string(m[1])
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			abs := filepath.Join(filepath.Dir(path), target)
			n++
			if r, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s links %s, outside the repository", rel, m[1])
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links %s, which does not exist", rel, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	readme, _ := os.ReadFile("../README.md")
	if !bytes.Contains(readme, []byte("](docs/reference.md)")) {
		t.Errorf("README.md does not link docs/reference.md")
	}
	t.Logf("%d relative links checked", n)
}

// Every command `agent-wrap help` lists is documented in docs/ (the host
// side in reference.md; the controller's and the authority's in their own
// documents), so the reference cannot silently fall behind the code.
func TestEveryCommandDocumented(t *testing.T) {
	var out, errb bytes.Buffer
	if code := cli.Run(context.Background(), []string{"help"}, nil, &out, &errb); code != 0 {
		t.Fatalf("agent-wrap help: exit %d: %s", code, errb.String())
	}
	var docs []byte
	files, _ := filepath.Glob("*.md")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b...)
	}
	inList := false
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case line == "commands:":
			inList = true
		case inList && strings.HasPrefix(line, "  "):
			name := strings.Fields(line)[0]
			if !regexp.MustCompile("`(agent-wrap )?" + regexp.QuoteMeta(name) + "[ `]").Match(docs) {
				t.Errorf("command %q is not documented in docs/*.md", name)
			}
		case inList && line == "":
			inList = false
		}
	}
}

// README.md's code map names every package of the module (as `path`,
// relative to the top of the tree), so a package added later is placed on
// its side (host, controller, shared, tools) the day it is written.
func TestCodeMapListsEveryPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, codeMap, ok := strings.Cut(string(readme), "\n## Code map\n")
	if !ok {
		t.Fatal("README.md has no \"## Code map\" section")
	}
	codeMap, _, _ = strings.Cut(codeMap, "\n## ")
	n := 0
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || rel == "." {
			continue
		}
		n++
		if !strings.Contains(codeMap, "`"+filepath.ToSlash(rel)+"`") {
			t.Errorf("README.md's code map does not name the package %s", rel)
		}
	}
	if n < 20 {
		t.Fatalf("go list found only %d packages", n)
	}
}
