package deploy

import (
	"os"
	"path/filepath"
	"testing"
)

// install puts agent-wrap-mcp beside agent-wrap when it sits beside the
// running binary (a controller that has it), and nothing more when it
// does not (a host deploy sent agent-wrap alone).
func TestInstallShipsMCPServerBeside(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "agent-wrap")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho fake agent-wrap\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{Method: Cron, User: true, Home: "/home/al", RunRoot: "/home/al/.agent-runs", Executable: exe}
	has := func(p *Plan) *File {
		for i := range p.Files {
			if p.Files[i].Path == "/home/al/.local/bin/agent-wrap-mcp" {
				return &p.Files[i]
			}
		}
		return nil
	}
	p, err := NewPlan(opts)
	if err != nil {
		t.Fatal(err)
	}
	if f := has(p); f != nil {
		t.Errorf("no agent-wrap-mcp beside the binary, yet the plan installs %s", f.Path)
	}
	server := []byte("#!/bin/sh\necho fake agent-wrap-mcp\n")
	if err := os.WriteFile(filepath.Join(dir, "agent-wrap-mcp"), server, 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err = NewPlan(opts); err != nil {
		t.Fatal(err)
	}
	f := has(p)
	if f == nil || string(f.Data) != string(server) || f.Perm != 0o755 {
		t.Fatalf("agent-wrap-mcp beside the binary: plan entry %+v, want it installed beside agent-wrap, 0755", f)
	}
	dest := t.TempDir()
	if _, err := p.Apply(os.Stderr, dest, false); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "home/al/.local/bin/agent-wrap-mcp")); err != nil || string(b) != string(server) {
		t.Errorf("installed agent-wrap-mcp: %q, %v", b, err)
	}
}
