package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPackagingOutOfBinary keeps the packaging tools out of the binary:
// nfpm runs as `go tool nfpm` and ./cmd/packaging is a build program, so
// neither (nor anything only they need) may be linked into agent-wrap.
func TestPackagingOutOfBinary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 50 {
		t.Fatalf("go list -deps listed only %d packages", len(pkgs))
	}
	for _, pkg := range pkgs {
		if strings.Contains(pkg, "goreleaser") || pkg == "github.com/agent-wrap/agent-wrap/cmd/packaging" {
			t.Errorf("the binary links %s, a packaging tool", pkg)
		}
	}
}

// TestNoPeriodicMaxprocsRead keeps the runtime from re-reading the cgroup's
// CPU quota every second in every wrapper (see main.go's //go:debug).
func TestNoPeriodicMaxprocsRead(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.DefaultGODEBUG}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	settings := strings.Split(strings.TrimSpace(string(out)), ",")
	for _, s := range settings {
		if s == "updatemaxprocs=0" {
			return
		}
	}
	t.Fatalf("the binary's default GODEBUG is %q: it lacks updatemaxprocs=0", strings.TrimSpace(string(out)))
}
