package controller

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayers holds the seam the package doc describes: the lifecycle
// (this package) starts no process itself, every remote command going
// through transport.Host.Call; the transport knows nothing of the ledger
// or of runs (it imports neither this package nor the ledger).
func TestLayers(t *testing.T) {
	for _, c := range []struct {
		dir       string
		forbidden []string
	}{
		{".", []string{"os/exec"}},
		{"transport", []string{"github.com/agent-wrap/agent-wrap/controller", "github.com/agent-wrap/agent-wrap/ledger"}},
	} {
		files, err := filepath.Glob(filepath.Join(c.dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", c.dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				for _, bad := range c.forbidden {
					if p == bad {
						t.Errorf("%s imports %s: across the seam (see doc.go's Layers)", f, p)
					}
				}
			}
		}
	}
}
