package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The MCP SDK lives in agent-wrap-mcp alone: agent-wrap, which every run's
// wrapper is, must not link it (it would cost each wrapper start about 2.6
// MiB of binary and 3 MiB of memory), and agent-wrap stays within 10 MiB
// built as make builds it.
func TestAgentWrapLinksNoMCPSDK(t *testing.T) {
	for _, goos := range []string{"linux", "darwin"} {
		cmd := exec.Command("go", "list", "-deps", "github.com/agent-wrap/agent-wrap/cmd/agent-wrap")
		cmd.Env = append(os.Environ(), "GOOS="+goos, "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./cmd/agent-wrap (%s): %v", goos, err)
		}
		for _, p := range strings.Fields(string(out)) {
			if strings.Contains(p, "modelcontextprotocol") || strings.HasSuffix(p, "/mcpserver") {
				t.Errorf("agent-wrap (%s) links %s: only agent-wrap-mcp may", goos, p)
			}
		}
	}
	// And agent-wrap-mcp does link it: the split is real.
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil || !strings.Contains(string(out), "github.com/modelcontextprotocol/go-sdk/mcp\n") {
		t.Errorf("agent-wrap-mcp does not link the MCP SDK (%v)", err)
	}
}

func TestAgentWrapSize(t *testing.T) {
	const limit = 10 << 20
	bin := filepath.Join(t.TempDir(), "agent-wrap")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/agent-wrap/agent-wrap/cli.version=v0.0.0-size-test -X github.com/agent-wrap/agent-wrap/cli.commit=0123456789abcdef0123456789abcdef01234567",
		"-o", bin, "github.com/agent-wrap/agent-wrap/cmd/agent-wrap")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent-wrap (linux/amd64, as make builds it): %d bytes, %d under 10 MiB", fi.Size(), limit-fi.Size())
	if fi.Size() > limit {
		t.Errorf("agent-wrap is %d bytes, over 10 MiB (%d)", fi.Size(), limit)
	}
}
