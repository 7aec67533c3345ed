package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/sshtest"
)

// linuxBuild returns a dist directory holding this machine's build alone,
// agent-wrap-linux-amd64, static as make dist builds it (deploy checks
// SHA256SUMS only where there is one): one build, not make dist's five.
func linuxBuild(t *testing.T) string {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Fatalf("this test sends the amd64 build to this machine, which is %s", runtime.GOARCH)
	}
	d := t.TempDir()
	cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(d, "agent-wrap-linux-amd64"), "github.com/agent-wrap/agent-wrap/cmd/agent-wrap")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return d
}

// A host with neither systemd nor cron to keep the watchdog running (a
// container, a minimal VM): `deploy --binary-only` installs the binary
// alone, through the real sshd on loopback, and the line names the exact
// command to keep running there. That command, run as it is (under the
// --dest-root the files were written to), is a working watchdog: a run
// whose wrapper is SIGKILLed is stopped by it once its lease passes.
func TestDeployBinaryOnly(t *testing.T) {
	d := linuxBuild(t)
	s := sshtest.Start(t)
	workstation := filepath.Join(d, "agent-wrap-linux-amd64")
	destRoot := t.TempDir()
	runs := filepath.Join(t.TempDir(), "runs")

	args := append([]string{"deploy"}, s.SSHArgs()...)
	args = append(args, "--dist", d, "--binary-only", "--dest-root", destRoot, "--run-root", runs, s.Destination())
	out, errOut, code := run(t, workstation, args...)
	line := "/usr/local/bin/agent-wrap --root " + runs + " watchdog --interval 5s"
	want := s.Destination() + " ok: linux/amd64, 1 of 1 files changed; to do there: " + line +
		"; not checked over ssh (files written under --dest-root, or --dry-run)\n"
	if code != 0 || out != want {
		t.Fatalf("deploy --binary-only: exit %d, stdout %q, want 0 and %q\nstderr: %s", code, out, want, errOut)
	}
	if !strings.Contains(errOut, "nothing there keeps the watchdog running") {
		t.Errorf("deploy --binary-only: stderr does not say nothing keeps the watchdog running:\n%s", errOut)
	}
	// The binary alone: no unit, no cron line.
	var written []string
	filepath.WalkDir(destRoot, func(p string, de os.DirEntry, err error) error {
		if err == nil && !de.IsDir() {
			written = append(written, strings.TrimPrefix(p, destRoot))
		}
		return nil
	})
	if strings.Join(written, " ") != "/usr/local/bin/agent-wrap" {
		t.Errorf("deploy --binary-only wrote %v, want the binary alone", written)
	}
	for _, a := range []string{"--systemd", "--cron", "--timer"} {
		if _, errOut, code := run(t, workstation, "deploy", "--binary-only", a, s.Destination()); code != 64 || !strings.Contains(errOut, "--binary-only installs no watchdog") {
			t.Errorf("deploy --binary-only %s: exit %d, want 64:\n%s", a, code, errOut)
		}
	}

	// The line, run as the operator would (the binary where this test's
	// --dest-root put it), keeps a watchdog: start a run, SIGKILL its
	// wrapper, and the watchdog stops its job once the lease has passed.
	bin := filepath.Join(destRoot, "usr/local/bin/agent-wrap")
	words := strings.Fields(line)
	wd := exec.Command(bin, words[1:]...)
	wd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var wdOut strings.Builder
	wd.Stdout, wd.Stderr = &wdOut, &wdOut
	if err := wd.Start(); err != nil {
		t.Fatal(err)
	}
	wdDone := make(chan struct{})
	go func() { wd.Wait(); close(wdDone) }()
	t.Cleanup(func() {
		syscall.Kill(-wd.Process.Pid, syscall.SIGKILL)
		<-wdDone
	})
	if o, errOut, code := run(t, bin, "--root", runs, "run", "--detach", "--lease", "2s", "--grace", "1s", "bo-1", "--", "sleep", "300"); code != 0 {
		t.Fatalf("run --detach: exit %d\n%s\n%s", code, o, errOut)
	}
	var st struct {
		State      string `json:"state"`
		Cause      string `json:"cause"`
		WrapperPID int    `json:"wrapper_pid"`
		PGID       int    `json:"pgid"`
	}
	read := func() {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(runs, "bo-1", "status.json"))
		if err == nil {
			err = json.Unmarshal(b, &st)
		}
		if err != nil {
			t.Fatalf("status.json: %v", err)
		}
	}
	read()
	t.Cleanup(func() {
		if st.State != "cancelled" && st.PGID > 0 {
			syscall.Kill(-st.PGID, syscall.SIGKILL) // the job, if the watchdog did not stop it
		}
	})
	if err := syscall.Kill(st.WrapperPID, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the wrapper %d: %v", st.WrapperPID, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for read(); st.State != "cancelled"; read() {
		select {
		case <-wdDone:
			t.Fatalf("the watchdog line exited: %s", wdOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run is %s 2 minutes after its lease, its wrapper dead: the watchdog line stopped nothing\nwatchdog: %s", st.State, wdOut.String())
		}
		time.Sleep(100 * time.Millisecond) // poll interval, not synchronisation
	}
	if st.Cause != "lease" {
		t.Errorf("the run stopped with cause %q, want lease", st.Cause)
	}
}
