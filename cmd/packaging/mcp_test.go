package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The package ships agent-wrap-mcp beside agent-wrap when make package
// gives it (-mcp-bin), executable, and nothing of it otherwise.
func TestContentsShipMCPServer(t *testing.T) {
	dir := t.TempDir()
	bin, mcp := filepath.Join(dir, "agent-wrap"), filepath.Join(dir, "agent-wrap-mcp")
	for _, p := range []string{bin, mcp} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	find := func(es []Entry) *Entry {
		for i := range es {
			if es[i].Dst == MCPBin {
				return &es[i]
			}
		}
		return nil
	}
	mods, goroot, err := Linked("amd64")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Bin: bin, Modules: mods, GoRoot: goroot}
	es, err := Contents(bin, o)
	if err != nil {
		t.Fatal(err)
	}
	if e := find(es); e != nil {
		t.Errorf("without -mcp-bin the package holds %s", e.Dst)
	}
	o.MCPBin = mcp
	es, err = Contents(bin, o)
	if err != nil {
		t.Fatal(err)
	}
	if e := find(es); e == nil || e.Mode != 0o755 || e.src != mcp {
		t.Errorf("with -mcp-bin: entry %+v, want %s, mode 0755, from %s", e, MCPBin, mcp)
	}
}
