package cli

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestNeedsLinux: what a macOS or FreeBSD build answers in place of a host
// command (host_other.go; that build is cross-compiled and vetted by make
// test, not run here): one line naming the word, the system and the way
// to run on a Linux host, and 125.
func TestNeedsLinux(t *testing.T) {
	var out, errb bytes.Buffer
	e := &Env{Stdout: &out, Stderr: &errb}
	if code := needsLinux(e, "cancel"); code != ExitCannot {
		t.Errorf("exit %d, want %d", code, ExitCannot)
	}
	msg := errb.String()
	if strings.Count(msg, "\n") != 1 || out.Len() != 0 {
		t.Errorf("stderr %q, stdout %q: want one line on stderr only", msg, out.String())
	}
	for _, want := range []string{"agent-wrap: cancel: ", "need Linux", runtime.GOOS + "/" + runtime.GOARCH, "agent-wrap ssh HOST -- CMD"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stderr %q lacks %q", msg, want)
		}
	}
}
