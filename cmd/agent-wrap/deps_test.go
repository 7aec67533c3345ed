package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoMethodLookupByName keeps packages that look methods up by name
// through reflect out of the binary. The linker cannot tell which method
// such a lookup will want, so it keeps every exported method of every type
// the binary keeps: text/template in deploy alone cost 1.7 MiB of a 6.3 MiB
// binary, against a 6 MiB limit (BENCHMARKS.md, "binary size").
func TestNoMethodLookupByName(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		switch pkg {
		case "text/template", "html/template":
			t.Errorf("the binary links %s; render with plain string code instead (see deploy.render)", pkg)
		}
	}
}
