package transport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSSHConfigReadOncePerDestination: the two questions asked of the
// user's ssh configuration (keepalives, a ControlPath of their own) run
// `ssh -G` once per destination for the whole process, however many hosts
// go there. The rsh is a wrapper named ssh that logs each real ssh it
// starts with -G, and a configuration with an Include configMentions
// cannot follow (a token in it), so that both questions go to ssh -G.
func TestSSHConfigReadOncePerDestination(t *testing.T) {
	real, err := exec.LookPath("ssh")
	if err != nil {
		t.Fatal("OpenSSH's ssh not found: the test runs the real ssh -G")
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "g.log")
	wrapper := filepath.Join(dir, "bin", "ssh")
	os.Mkdir(filepath.Dir(wrapper), 0o755)
	script := "#!/bin/sh\nfor a; do if [ \"$a\" = -G ]; then echo \"$*\" >> " + log + "; fi; done\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config")
	if err := os.WriteFile(cfg, []byte("Include ~/agent-wrap-test-none-%d\nPort 22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rsh := []string{wrapper, "-F", cfg}
	for _, opt := range []string{"serveraliveinterval", "controlpath"} {
		if got := configMentions(rsh, opt); got != cannotTell {
			t.Fatalf("configMentions(%q) = %d, want cannotTell: the test would not reach ssh -G", opt, got)
		}
	}
	muxDir := filepath.Join(dir, "mux")
	dests := []string{"one.invalid", "two.invalid"}
	for round := 0; round < 3; round++ {
		for _, dest := range dests {
			h, err := NewHost(rsh, dest, "agent-wrap", "", dir, "run-"+strings.Split(dest, ".")[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := h.SetMux(MuxAuto, muxDir); err != nil {
				h.Close()
				t.Fatal(err)
			}
			<-h.probed
			// Both answers came from ssh -G: neither is set by this
			// configuration, so the keepalives are added and the calls
			// are sessions on agent-wrap's masters.
			if len(h.keepalive) == 0 || !h.Muxed() {
				t.Errorf("%s: keepalive %q, muxed %v: want the defaults and the masters", dest, h.keepalive, h.Muxed())
			}
			h.Close()
		}
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("no ssh -G ran: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, dest := range dests {
		n := 0
		for _, l := range lines {
			if strings.HasSuffix(l, "-- "+dest) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("ssh -G ran %d times for %s, want once: %q", n, dest, lines)
		}
	}
	if len(lines) != len(dests) {
		t.Errorf("ssh -G ran %d times in all, want %d (one per destination): %q", len(lines), len(dests), lines)
	}
}
