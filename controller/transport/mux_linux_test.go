package transport

// Tests against a real sshd (internal/sshtest, which is Linux only, as the
// e2e tests are); the rest of the package's tests run wherever it builds.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/sshtest"
)

// TestMasterPIDAgainstSSHCheck: the PID a real ControlMaster gives in
// OpenSSH's mux protocol (masterPID) is the one `ssh -O check` reports.
func TestMasterPIDAgainstSSHCheck(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	dir, err := os.MkdirTemp("", "awmux-pid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "m")
	args := append(append([]string{}, srv.SSHArgs()...), "-o", "ControlMaster=yes", "-o", "ControlPath="+sock, "-o", "ControlPersist=30", "-N", "--", srv.Destination())
	if out, err := exec.Command("ssh", args...).CombinedOutput(); err != nil {
		t.Fatalf("starting a master: %v\n%s", err, out)
	}
	check := func(op string) string {
		out, _ := exec.Command("ssh", "-F", "/dev/null", "-o", "ControlPath="+sock, "-O", op, "x").CombinedOutput()
		return string(out)
	}
	defer check("exit")
	pid, err := masterPID(sock, 10*time.Second)
	if err != nil {
		t.Fatalf("masterPID: %v", err)
	}
	if want := fmt.Sprintf("(pid=%d)", pid); !strings.Contains(check("check"), want) {
		t.Errorf("masterPID = %d; ssh -O check says %q", pid, check("check"))
	}
	if _, err := masterPID(filepath.Join(dir, "none"), time.Second); err == nil {
		t.Error("masterPID of no socket: no error")
	}
}
