package deploy_test

import (
	"bytes"
	"context"
	"debug/elf"
	"debug/macho"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/sshtest"
)

// The release builds are made once per test binary, by `make dist` itself
// (two static cross builds take a while on a small machine), into a temp
// directory that TestMain removes.
var dist struct {
	once sync.Once
	dir  string
	out  []byte
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if dist.dir != "" {
		os.RemoveAll(dist.dir)
	}
	os.Exit(code)
}

// distDir returns a directory holding what `make dist` builds.
func distDir(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the release binaries with make dist; skipped with -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("make not found (CI=true)")
		}
		t.Skip("make not found")
	}
	dist.once.Do(func() {
		dist.dir, dist.err = os.MkdirTemp("", "agent-wrap-dist-")
		if dist.err != nil {
			return
		}
		// A version of this test process's own, so that its binaries differ
		// byte for byte from those of another `make test` running beside it
		// (noCopyLeft looks for copies of exactly these bytes in /tmp).
		// MCP_PLATFORMS= : deploy sends agent-wrap alone, so the MCP
		// server's five links would only cost time here.
		cmd := exec.Command("make", "-C", "..", "dist", "DISTDIR="+dist.dir, "MCP_PLATFORMS=",
			fmt.Sprintf("VERSION=test-%d-%d", os.Getpid(), time.Now().UnixNano()))
		dist.out, dist.err = cmd.CombinedOutput()
	})
	if dist.err != nil {
		t.Fatalf("make dist: %v\n%s", dist.err, dist.out)
	}
	return dist.dir
}

// TestDistStatic: both Linux builds are static executables for their machine (no
// PT_INTERP, so no dynamic loader and no libc needed on the host), `file`
// agrees where it is installed, SHA256SUMS verifies, and the amd64 build
// carries a version and a commit.
func TestDistStatic(t *testing.T) {
	d := distDir(t)
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		t.Run(arch, func(t *testing.T) {
			path := filepath.Join(d, "agent-wrap-linux-"+arch)
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Machine != machine || f.Type != elf.ET_EXEC {
				t.Errorf("%s: machine %v type %v, want %v ET_EXEC", path, f.Machine, f.Type, machine)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("%s has a %v program header: dynamically linked", path, p.Type)
				}
			}
			if _, err := exec.LookPath("file"); err == nil {
				out, err := exec.Command("file", "-b", path).Output()
				if err != nil || !bytes.Contains(out, []byte("statically linked")) {
					t.Errorf("file %s: %v: %s", path, err, out)
				}
			}
		})
	}
	// The controller builds: Mach-O for macOS on both CPUs, and an ELF
	// marked for FreeBSD.
	for arch, cpu := range map[string]macho.Cpu{"amd64": macho.CpuAmd64, "arm64": macho.CpuArm64} {
		t.Run("darwin-"+arch, func(t *testing.T) {
			f, err := macho.Open(filepath.Join(d, "agent-wrap-darwin-"+arch))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Cpu != cpu || f.Type != macho.TypeExec {
				t.Errorf("darwin-%s: cpu %v type %v, want %v executable", arch, f.Cpu, f.Type, cpu)
			}
		})
	}
	t.Run("freebsd-amd64", func(t *testing.T) {
		f, err := elf.Open(filepath.Join(d, "agent-wrap-freebsd-amd64"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if f.Machine != elf.EM_X86_64 || f.OSABI != elf.ELFOSABI_FREEBSD {
			t.Errorf("freebsd-amd64: machine %v OS ABI %v, want EM_X86_64 for FreeBSD", f.Machine, f.OSABI)
		}
	})
	t.Run("checksums", func(t *testing.T) {
		cmd := exec.Command("sha256sum", "-c", "--strict", "SHA256SUMS")
		cmd.Dir = d
		out, err := cmd.CombinedOutput()
		want := "agent-wrap-linux-amd64: OK\nagent-wrap-linux-arm64: OK\n" +
			"agent-wrap-darwin-amd64: OK\nagent-wrap-darwin-arm64: OK\nagent-wrap-freebsd-amd64: OK\n"
		if err != nil || string(out) != want {
			t.Errorf("sha256sum -c: %v\n%s\nwant\n%s", err, out, want)
		}
	})
	t.Run("licence", func(t *testing.T) {
		got, err := os.ReadFile(filepath.Join(d, "LICENSE"))
		want, werr := os.ReadFile(filepath.Join("..", "LICENSE"))
		if err != nil || werr != nil || !bytes.Equal(got, want) || !bytes.Contains(got, []byte("Apache License")) {
			t.Errorf("make dist ships no copy of the tree's LICENSE (the Apache License 2.0): %v, %v", err, werr)
		}
	})
	t.Run("version", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(d, "agent-wrap-linux-amd64"), "version").Output()
		re := regexp.MustCompile(`^agent-wrap (\S+) commit ([0-9a-f]{40}) go1\.\S+ linux/amd64\n$`)
		m := re.FindSubmatch(out)
		if err != nil || m == nil || string(m[1]) == "dev" {
			t.Errorf("version: %v: %q; want a stamped version and commit", err, out)
		}
	})
}

// run runs bin with args and returns its stdout, stderr and exit code.
func run(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%s %s: %v", bin, strings.Join(args, " "), err)
	}
	return o.String(), e.String(), code
}

// TestDeployLoopback deploys the release build to a real sshd on
// 127.0.0.1 (the same machine: the "remote" install writes under a temp
// --dest-root), deploys again to see nothing change, and runs a job over
// ssh through the deployed copy.
func TestDeployLoopback(t *testing.T) {
	d := distDir(t)
	s := sshtest.Start(t)
	workstation := filepath.Join(d, "agent-wrap-linux-amd64")
	dest := t.TempDir()
	runs := filepath.Join(t.TempDir(), "runs")

	deployArgs := append([]string{"deploy"}, s.SSHArgs()...)
	deployArgs = append(deployArgs, "--dist", d, "--cron", "--dest-root", dest, "--run-root", runs, s.Destination())

	out, errOut, code := run(t, workstation, deployArgs...)
	if want := s.Destination() + " ok: linux/amd64, 2 of 2 files changed; not checked over ssh (files written under --dest-root, or --dry-run)\n"; code != 0 || out != want {
		t.Fatalf("first deploy: exit %d, stdout %q, want 0 and %q\nstderr: %s\nsshd log:\n%s", code, out, want, errOut, s.Log())
	}
	out, errOut, code = run(t, workstation, deployArgs...)
	if want := s.Destination() + " ok: linux/amd64, unchanged; not checked over ssh (files written under --dest-root, or --dry-run)\n"; code != 0 || out != want {
		t.Fatalf("second deploy: exit %d, stdout %q, want 0 and %q\nstderr: %s", code, out, want, errOut)
	}

	// What landed: the very build, and a cron line watching the run root.
	installed := filepath.Join(dest, "usr/local/bin/agent-wrap")
	sent, _ := os.ReadFile(workstation)
	got, err := os.ReadFile(installed)
	if err != nil || !bytes.Equal(got, sent) {
		t.Fatalf("installed binary differs from the build sent (%v)", err)
	}
	cron, err := os.ReadFile(filepath.Join(dest, "etc/cron.d/agent-wrap"))
	if want := " /usr/local/bin/agent-wrap --root " + runs + " watchdog --once "; err != nil || !bytes.Contains(cron, []byte(want)) {
		t.Errorf("cron.d file (%v):\n%s\nwant a line with %q", err, cron, want)
	}
	noCopyLeft(t, sent)

	// Failures name their cause, and leave no copy behind.
	t.Run("refusals", func(t *testing.T) {
		bad := t.TempDir()
		if err := os.WriteFile(filepath.Join(bad, "agent-wrap-linux-amd64"), append(sent, 0), 0o755); err != nil {
			t.Fatal(err)
		}
		sums, _ := os.ReadFile(filepath.Join(d, "SHA256SUMS"))
		if err := os.WriteFile(filepath.Join(bad, "SHA256SUMS"), sums, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, dist, runRoot, want string }{
			{"no-build", t.TempDir(), runs, " failed: no amd64 build: "},
			{"checksum-mismatch", bad, runs, "agent-wrap-linux-amd64 does not match its SHA256SUMS entry"},
			{"remote-install-refuses", d, "/tmp/my runs", ` failed: install: agent-wrap: install: run root "/tmp/my runs": must be a clean absolute path`},
		} {
			args := append([]string{"deploy"}, s.SSHArgs()...)
			args = append(args, "--dist", tc.dist, "--cron", "--dest-root", dest, "--run-root", tc.runRoot, s.Destination())
			out, errOut, code := run(t, workstation, args...)
			if code != 1 || !strings.HasPrefix(out, s.Destination()+" failed: ") || !strings.Contains(out, tc.want) || strings.Count(out, "\n") != 1 {
				t.Errorf("%s: exit %d, stdout %q; want 1 and one line with %q\nstderr: %s", tc.name, code, out, tc.want, errOut)
			}
		}
		noCopyLeft(t, sent)
	})

	// Where the host's install cannot start the watchdog itself (here:
	// systemd not running, and --dest-root), the line says what to run there.
	t.Run("systemd-next", func(t *testing.T) {
		args := append([]string{"deploy"}, s.SSHArgs()...)
		args = append(args, "--dist", d, "--systemd", "--dest-root", t.TempDir(), "--run-root", runs, s.Destination())
		out, errOut, code := run(t, workstation, args...)
		want := s.Destination() + " ok: linux/amd64, 4 of 4 files changed; to do there: " +
			"systemctl daemon-reload && systemctl enable agent-wrap-watchdog.service && systemctl restart agent-wrap-watchdog.service; not checked over ssh (files written under --dest-root, or --dry-run)\n"
		if code != 0 || out != want {
			t.Errorf("exit %d, stdout %q, want 0 and %q\nstderr: %s", code, out, want, errOut)
		}
	})

	// A job over ssh through the deployed copy.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := s.Command(ctx, sshtest.Quote(installed, "--root", runs, "deploy-job-1", "--", "sh", "-c", "echo ok from the deployed copy"))
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil || o.String() != "ok from the deployed copy\n" {
		t.Fatalf("job over ssh: %v\nstdout: %q\nstderr: %s", err, o.String(), e.String())
	}
	b, err := os.ReadFile(filepath.Join(runs, "deploy-job-1", "status.json"))
	var st struct {
		State    string `json:"state"`
		ExitCode *int   `json:"exit_code"`
	}
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil || st.State != "finished" || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("status.json (%v): %s; want finished with exit_code 0", err, b)
	}
}

// noCopyLeft fails the test if a copy of bin is left in /tmp by deploy
// (the host is this machine, and the login's TMPDIR is unset).
func noCopyLeft(t *testing.T, bin []byte) {
	t.Helper()
	left, _ := filepath.Glob("/tmp/agent-wrap.??????")
	for _, l := range left {
		if b, err := os.ReadFile(l); err == nil && bytes.Equal(b, bin) {
			t.Errorf("temporary copy left behind: %s", l)
		}
	}
}

// TestDeployOneHostDown: one host answers, the other (a closed port on
// loopback) does not. Both are reported, in order, and the exit is 1.
func TestDeployOneHostDown(t *testing.T) {
	d := distDir(t)
	s := sshtest.Start(t)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()

	// The ports go in ssh:// destinations, so drop the server's -p (ssh
	// prefers -p to a port in the destination).
	var args []string
	sa := s.SSHArgs()
	for i := 0; i < len(sa); i++ {
		if sa[i] == "-p" {
			i++
			continue
		}
		args = append(args, sa[i])
	}
	good := "ssh://" + s.User() + "@127.0.0.1:" + strconv.Itoa(s.Port())
	bad := "ssh://" + s.User() + "@127.0.0.1:" + strconv.Itoa(closed)
	deployArgs := append(append([]string{"deploy"}, args...), "--dist", d, "--cron", "--dest-root", t.TempDir(), "--run-root", "/tmp/unused-runs", bad, good)

	out, errOut, code := run(t, filepath.Join(d, "agent-wrap-linux-amd64"), deployArgs...)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], bad+" failed: ssh: ") || !strings.Contains(lines[0], "Connection refused") ||
		lines[1] != good+" ok: linux/amd64, 2 of 2 files changed; not checked over ssh (files written under --dest-root, or --dry-run)" {
		t.Fatalf("exit %d, stdout:\n%s\nwant 1, %q failed (connection refused) then %q ok\nstderr: %s", code, out, bad, good, errOut)
	}
}
