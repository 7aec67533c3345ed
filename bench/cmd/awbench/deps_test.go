package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoTestingInBinary keeps package testing out of awbench: it drives
// internal/sshtest through its own sshtest.T (benchTB), not a testing.TB.
func TestNoTestingInBinary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 50 {
		t.Fatalf("go list -deps listed only %d packages", len(pkgs))
	}
	for _, pkg := range pkgs {
		if pkg == "testing" {
			t.Errorf("awbench links package testing")
		}
	}
}
