package e2e

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/sshtest"
)

// The controller loop of docs/guide.md, as the shell script
// testdata/controller.sh: renew every second over ssh, stop renewing, then
// reconcile. The script checks each step; the test adds the /proc evidence.
func TestControllerLoop(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "controller-loop"
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLong)
	defer cancel()
	// A 15 s lease renewed for 16 s: long enough that one renewal's ssh
	// round trip (a login runs the account's shell startup files; several
	// seconds on a machine loaded a hundredfold, as CI's can be) stays well
	// inside the lease.
	cmd := exec.CommandContext(ctx, "sh", "testdata/controller.sh", id, "15", "16")
	ssh := append([]string{"ssh"}, h.srv.SSHArgs()...)
	cmd.Env = append(cmd.Environ(),
		"SSH="+strings.Join(append(ssh, h.srv.Destination()), " "),
		"AW="+sshtest.Quote(bin, "--root", h.root),
	)
	out, err := cmd.CombinedOutput()
	t.Logf("controller.sh:\n%s", out)
	if err != nil {
		t.Fatalf("controller.sh: %v", err)
	}
	final, err := h.status(id)
	if err != nil {
		t.Fatal(err)
	}
	wantFinal(t, final, "cancelled", "lease", 124)
	waitGroupEmpty(t, final.PGID)
	renewed := 0
	for _, e := range h.events(id) {
		if e == "lease_renewed" {
			renewed++
		}
	}
	if want := "renewed " + strconv.Itoa(renewed) + " times"; renewed < 2 || !strings.Contains(string(out), want) {
		t.Errorf("journal has %d lease_renewed events; want at least 2, and the script to say %q", renewed, want)
	}
}
