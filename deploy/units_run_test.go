package deploy_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/deploy"
)

// installed renders a plan for the release build with real paths under a
// temp dir and writes it there (no --dest-root needed: every path is in tmp).
func installed(t *testing.T, o deploy.Options) (home string, files map[string]string) {
	t.Helper()
	tmp := t.TempDir()
	o.Executable = filepath.Join(distDir(t), "agent-wrap-linux-amd64")
	o.Home = filepath.Join(tmp, "home")
	o.Prefix = filepath.Join(tmp, "prefix")
	o.RunRoot = filepath.Join(tmp, "runs")
	p, err := deploy.NewPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	// The units and the crontab file are read from the plan, not installed:
	// their directories are outside tmp for a system install.
	files = map[string]string{}
	for i, f := range p.Files {
		files[filepath.Base(f.Path)] = string(f.Data)
		if !strings.HasPrefix(f.Path, tmp) {
			p.Files[i].Path = filepath.Join(tmp, "elsewhere", f.Path)
		}
	}
	if _, err := p.Apply(&strings.Builder{}, "", false); err != nil {
		t.Fatal(err)
	}
	return o.Home, files
}

// execStart returns the argv of a unit's ExecStart= line. Paths in units
// never need quoting (NewPlan refuses any that would), so fields suffice.
func execStart(t *testing.T, unit string) []string {
	t.Helper()
	for _, l := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("no ExecStart= in\n%s", unit)
	return nil
}

// TestServiceSpeaksNotify runs the service's own ExecStart the way systemd
// would for Type=notify with WatchdogSec=: NOTIFY_SOCKET and WATCHDOG_USEC
// set. It must report READY=1, keep sending WATCHDOG=1 well inside the
// watchdog time, and on TERM say STOPPING=1 and exit 0 (Restart=on-failure
// would otherwise restart it).
func TestServiceSpeaksNotify(t *testing.T) {
	_, files := installed(t, deploy.Options{Method: deploy.Systemd})
	argv := execStart(t, files[deploy.ServiceUnit])

	sock := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	cmd := exec.Command(argv[0], argv[1:]...)
	// WatchdogSec=2s, so pings must come at least every second.
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=2000000")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waited := false
	defer func() {
		if !waited {
			cmd.Process.Kill() // by its PID, only if the test failed early
			<-exited
		}
	}()

	recv := func(within time.Duration) string {
		t.Helper()
		buf := make([]byte, 256)
		l.SetReadDeadline(time.Now().Add(within))
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("no notification within %v: %v\nwatchdog output:\n%s", within, err, out.String())
		}
		return string(buf[:n])
	}
	if got := recv(30 * time.Second); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	last := time.Now()
	for i := 0; i < 3; i++ {
		if got := recv(2 * time.Second); got != "WATCHDOG=1" {
			t.Fatalf("notification %q, want WATCHDOG=1", got)
		}
		if gap := time.Since(last); gap > 2*time.Second {
			t.Errorf("WATCHDOG=1 came %v after the previous one; systemd would have killed the service", gap)
		}
		last = time.Now()
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		got := recv(10 * time.Second)
		if got == "STOPPING=1" {
			break
		}
		if got != "WATCHDOG=1" {
			t.Fatalf("notification %q after TERM, want STOPPING=1", got)
		}
	}
	select {
	case err := <-exited:
		waited = true
		if err != nil {
			t.Errorf("watchdog exited with %v after TERM, want 0\n%s", err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("watchdog still running 10s after TERM\n%s", out.String())
	}
}

// TestOnceAndCronLinesRun runs the one-pass service's ExecStart and the
// user crontab line through sh, as cron would: both exit 0, and cron's
// output goes to its log.
func TestOnceAndCronLinesRun(t *testing.T) {
	_, files := installed(t, deploy.Options{Method: deploy.Systemd})
	argv := execStart(t, files[deploy.OnceServiceUnit])
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}

	home, files := installed(t, deploy.Options{Method: deploy.Cron, User: true})
	line := strings.TrimSpace(files["watchdog.crontab"])
	f := strings.SplitN(line, " ", 6)
	if len(f) != 6 || strings.Join(f[:5], " ") != "* * * * *" {
		t.Fatalf("crontab line %q", line)
	}
	cmd := exec.Command("/bin/sh", "-c", f[5])
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "SHELL=/bin/sh"}
	if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf("sh -c %q: %v, output %q (want none: it goes to the log)", f[5], err, out)
	}
	log := filepath.Join(home, ".local/state/agent-wrap/watchdog.log")
	if _, err := os.Stat(log); err != nil {
		t.Errorf("cron log: %v", err)
	}
}
