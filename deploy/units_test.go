package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// fakeBinary writes a small executable to stand for the running binary:
// NewPlan copies whatever it is given.
func fakeBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent-wrap-src")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho fake agent-wrap\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUnitsVerify renders every unit, system and user, puts the binary
// where ExecStart points, and runs `systemd-analyze verify` on the files
// by path. verify exits 0 on mere warnings (an unknown key, a bad section),
// so any output on stderr fails the test too.
func TestUnitsVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze not found (CI=true); hint: apt-get install systemd")
		}
		t.Skip("systemd-analyze not found; hint: apt-get install systemd")
	}
	for _, tc := range []struct {
		name string
		user bool
	}{{"system", false}, {"user", true}} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			p, err := NewPlan(Options{
				Method:     Systemd,
				User:       tc.user,
				Home:       filepath.Join(tmp, "home"),
				Prefix:     filepath.Join(tmp, "prefix"),
				RunRoot:    filepath.Join(tmp, "runs"),
				Executable: fakeBinary(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			// The binary goes to its real path (under tmp); the units go to
			// one directory of their own, verified by path.
			unitDir := filepath.Join(tmp, "units")
			var units []string
			for _, f := range p.Files {
				target := f.Path
				if f.Path != p.Bin {
					target = filepath.Join(unitDir, filepath.Base(f.Path))
					units = append(units, target)
				}
				if err := f.write(target); err != nil {
					t.Fatal(err)
				}
			}
			if len(units) != 3 {
				t.Fatalf("rendered %d units, want 3: %v", len(units), units)
			}
			args := []string{"verify"}
			if tc.user {
				args = []string{"--user", "verify"}
			}
			cmd := exec.Command(sa, append(args, units...)...)
			// A user-mode verify needs a runtime directory, not a user manager.
			rt := filepath.Join(tmp, "runtime")
			if err := os.Mkdir(rt, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+rt, "SYSTEMD_LOG_LEVEL=notice")
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			err = cmd.Run()
			if err != nil || strings.TrimSpace(stderr.String()) != "" {
				t.Fatalf("systemd-analyze %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, stderr.String())
			}
		})
	}
}

// TestUnitContents checks what systemd-analyze does not: the service is the
// long-running notify loop, the once-service does one pass, and both run
// the installed binary on the right run root.
func TestUnitContents(t *testing.T) {
	for _, user := range []bool{false, true} {
		p, err := NewPlan(Options{Method: Systemd, User: user, Home: "/home/al", RunRoot: "/home/al/.agent-runs", Executable: fakeBinary(t)})
		if err != nil {
			t.Fatal(err)
		}
		wantBin, wantDir, wantedBy := "/usr/local/bin/agent-wrap", "/etc/systemd/system/", "WantedBy=multi-user.target"
		if user {
			wantBin, wantDir, wantedBy = "/home/al/.local/bin/agent-wrap", "/home/al/.config/systemd/user/", "WantedBy=default.target"
		}
		if p.Bin != wantBin {
			t.Errorf("user=%v: Bin = %s, want %s", user, p.Bin, wantBin)
		}
		files := map[string]string{}
		for _, f := range p.Files[1:] {
			if !strings.HasPrefix(f.Path, wantDir) || f.Perm != 0o644 {
				t.Errorf("user=%v: %s mode %v, want it in %s with mode 0644", user, f.Path, f.Perm, wantDir)
			}
			files[filepath.Base(f.Path)] = string(f.Data)
		}
		for name, want := range map[string][]string{
			ServiceUnit: {"Type=notify", "WatchdogSec=30s", "Restart=on-failure", wantedBy,
				"ExecStart=" + wantBin + " --root /home/al/.agent-runs watchdog --interval 5s"},
			OnceServiceUnit: {"Type=oneshot", "ExecStart=" + wantBin + " --root /home/al/.agent-runs watchdog --once"},
			TimerUnit:       {"Unit=" + OnceServiceUnit, "WantedBy=timers.target"},
		} {
			for _, w := range want {
				if !strings.Contains(files[name], "\n"+w+"\n") {
					t.Errorf("user=%v: %s lacks the line %q:\n%s", user, name, w, files[name])
				}
			}
			// Nothing that would stop the watchdog seeing or signalling jobs.
			for _, bad := range []string{"PrivatePIDs=", "PrivateUsers=", "ProtectProc=", "ProtectHome=", "PrivateTmp=", "\nCapabilityBoundingSet="} {
				if strings.Contains(files[name], "\n"+bad) {
					t.Errorf("user=%v: %s sets %s", user, name, bad)
				}
			}
		}
	}
}

func TestCronLines(t *testing.T) {
	t.Run("system", func(t *testing.T) {
		p, err := NewPlan(Options{Method: Cron, UserName: "root", RunRoot: "/root/.agent-runs", Executable: fakeBinary(t)})
		if err != nil {
			t.Fatal(err)
		}
		f := p.Files[len(p.Files)-1]
		want := "\n* * * * * root /usr/local/bin/agent-wrap --root /root/.agent-runs watchdog --once >>/var/log/agent-wrap-watchdog.log 2>&1\n"
		if f.Path != "/etc/cron.d/agent-wrap" || f.Perm != 0o644 || !strings.Contains(string(f.Data), want) {
			t.Errorf("cron.d file %s %v:\n%s\nwant the line%s", f.Path, f.Perm, f.Data, want)
		}
		if p.Activate != "" {
			t.Errorf("cron.d needs no activation, got %q", p.Activate)
		}
	})
	t.Run("user", func(t *testing.T) {
		p, err := NewPlan(Options{Method: Cron, User: true, Home: "/home/al", RunRoot: "/home/al/.agent-runs", Executable: fakeBinary(t)})
		if err != nil {
			t.Fatal(err)
		}
		f := p.Files[len(p.Files)-1]
		want := "* * * * * /home/al/.local/bin/agent-wrap --root /home/al/.agent-runs watchdog --once >>/home/al/.local/state/agent-wrap/watchdog.log 2>&1 " + CronMarker + "\n"
		if f.Path != "/home/al/.config/agent-wrap/watchdog.crontab" || string(f.Data) != want {
			t.Errorf("crontab file %s:\n%s\nwant\n%s", f.Path, f.Data, want)
		}
		if !strings.Contains(p.Activate, "crontab -") {
			t.Errorf("Activate = %q, want a crontab command", p.Activate)
		}
	})
}

// TestUnsafePaths: every path is written unquoted into ExecStart=, a cron
// line and a shell command, so anything that would need quoting is refused.
func TestUnsafePaths(t *testing.T) {
	bin := fakeBinary(t)
	for name, o := range map[string]Options{
		"space-in-root":    {Method: Cron, UserName: "root", RunRoot: "/tmp/my runs"},
		"percent-in-root":  {Method: Systemd, RunRoot: "/tmp/runs%h"},
		"relative-prefix":  {Method: Systemd, RunRoot: "/r", Prefix: "usr/local"},
		"dollar-in-prefix": {Method: Systemd, RunRoot: "/r", Prefix: "/opt/$x"},
		"unclean-root":     {Method: Systemd, RunRoot: "/r/../etc"},
		"timer-with-cron":  {Method: Cron, Timer: true, UserName: "root", RunRoot: "/r"},
		"user-no-home":     {Method: Cron, User: true, RunRoot: "/r"},
		"no-method":        {RunRoot: "/r"},
	} {
		o.Executable = bin
		if _, err := NewPlan(o); err == nil {
			t.Errorf("%s: NewPlan(%+v) succeeded, want an error", name, o)
		}
	}
}

func TestSafePath(t *testing.T) {
	for p, want := range map[string]bool{
		"/usr/local/bin/agent-wrap": true,
		"/home/ci/.agent-runs":      true,
		"/srv/runs@2/x+y_z-1.0":     true,
		"/":                         true,
		"":                          false,
		"relative/path":             false,
		"/tmp/a b":                  false,
		"/tmp/%h":                   false,
		"/tmp/$HOME":                false,
		`/tmp/a\b`:                  false,
		"/tmp/'q'":                  false,
		`/tmp/"q"`:                  false,
		"/tmp/é":                    false,
		"/tmp/a\nb":                 false,
	} {
		if got := safePath(p); got != want {
			t.Errorf("safePath(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestRenderMarks: the two marks of units/*, and that anything else in
// braces, or a value that looks like a mark, is not taken for one.
func TestRenderMarks(t *testing.T) {
	fsys := fstest.MapFS{
		"units/hardening": {Data: []byte("A=1\n{{system}}B=2\n")},
		"units/unit":      {Data: []byte("# {{UserFlag}} on {{Root}}\n{{system}}After=x\nExecStart={{Bin}}\n{{Hardening}}\nWantedBy={{WantedBy}}\n")},
		"units/unknown":   {Data: []byte("X={{.Bin}}\n")},
		"units/unclosed":  {Data: []byte("X={{Bin\n}}\n")},
	}
	d := unitData{Bin: "/b/{{Root}}", Root: "/r"}
	for _, tc := range []struct {
		user bool
		want string
	}{
		{false, "#  on /r\nAfter=x\nExecStart=/b/{{Root}}\nA=1\nB=2\nWantedBy=multi-user.target\n"},
		{true, "#  --user on /r\nExecStart=/b/{{Root}}\nA=1\nWantedBy=default.target\n"},
	} {
		d.User = tc.user
		got, err := renderFS(fsys, "unit", d)
		if err != nil || string(got) != tc.want {
			t.Errorf("user=%v: got %q, %v; want %q", tc.user, got, err, tc.want)
		}
	}
	for _, name := range []string{"unknown", "unclosed", "missing"} {
		if got, err := renderFS(fsys, name, d); err == nil {
			t.Errorf("%s: rendered %q, want an error", name, got)
		}
	}
}

// TestUnitHardening: the system units get the whole hardening block, the
// user units only the part a user manager can apply.
func TestUnitHardening(t *testing.T) {
	for _, user := range []bool{false, true} {
		for _, name := range []string{ServiceUnit, OnceServiceUnit} {
			b, err := render(name, unitData{Bin: "/b", Root: "/r", User: user})
			if err != nil {
				t.Fatal(err)
			}
			for line, inUser := range map[string]bool{
				"NoNewPrivileges=yes": true, "UMask=0077": true,
				"ProtectSystem=full": false, "RestrictAddressFamilies=AF_UNIX": false,
			} {
				want := !user || inUser
				if got := strings.Contains(string(b), "\n"+line+"\n"); got != want {
					t.Errorf("user=%v: %s has %s: %v, want %v", user, name, line, got, want)
				}
			}
			if strings.Contains(string(b), "{{") {
				t.Errorf("user=%v: %s keeps a mark:\n%s", user, name, b)
			}
		}
	}
}

// A binary-only plan holds the binary alone, and the line it asks the
// operator to keep running is the systemd service's own ExecStart, so the
// two cannot drift apart.
func TestBinaryOnlyPlan(t *testing.T) {
	o := Options{Method: BinaryOnly, User: true, Home: "/home/al", RunRoot: "/home/al/.agent-runs", Executable: fakeBinary(t)}
	p, err := NewPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Files) != 1 || p.Files[0].Path != "/home/al/.local/bin/agent-wrap" || p.Activate != "" {
		t.Errorf("binary-only plan: files %v, activate %q; want the binary alone and nothing to activate", p.Files, p.Activate)
	}
	if want := "/home/al/.local/bin/agent-wrap --root /home/al/.agent-runs watchdog --interval 5s"; p.Keep != want {
		t.Errorf("Keep = %q, want %q", p.Keep, want)
	}
	o.Method = Systemd
	sp, err := NewPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range sp.Files {
		if filepath.Base(f.Path) == ServiceUnit && !strings.Contains(string(f.Data), "\nExecStart="+p.Keep+"\n") {
			t.Errorf("the service's ExecStart is not the binary-only line %q:\n%s", p.Keep, f.Data)
		}
	}
	o.Method, o.Timer = BinaryOnly, true
	if _, err := NewPlan(o); err == nil {
		t.Errorf("a binary-only plan with a timer was accepted")
	}
}
