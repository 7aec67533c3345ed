package main

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestNoTestingInBinary keeps package testing out of awbench: it drives
// internal/sshtest through its own sshtest.T (benchTB), not a testing.TB.
func TestNoTestingInBinary(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{len .Deps}}{{range .Deps}}{{if eq . "testing"}} testing{{end}}{{end}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	n, linked, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	if deps, err := strconv.Atoi(n); err != nil || deps < 50 {
		t.Fatalf("go list says %q: want the number of awbench's dependencies (50 or more)", out)
	}
	if linked != "" {
		t.Errorf("awbench links package testing")
	}
}
