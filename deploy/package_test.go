package deploy

import (
	"path/filepath"
	"strings"
	"testing"
)

// The packaged units are install's units rendered for the package: the
// package's binary, the run root of whoever the service runs as (%h), the
// package named as what installed them; system and user units alike. The
// install units still name the install command. (packaging's TestPackage
// verifies the packaged files with systemd-analyze once dpkg installed them.)
func TestPackageUnits(t *testing.T) {
	files, err := PackageUnits("/usr/bin/agent-wrap")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 6 {
		t.Fatalf("%d units, want 6", len(files))
	}
	for _, f := range files {
		dir, name := filepath.Split(f.Path)
		user := dir == PackageUserUnitDir+"/"
		if !user && dir != PackageSystemUnitDir+"/" || f.Perm != 0o644 {
			t.Errorf("%s mode %v: want it in %s or %s, mode 0644", f.Path, f.Perm, PackageSystemUnitDir, PackageUserUnitDir)
		}
		s := string(f.Data)
		if !strings.HasPrefix(s, "# Installed by the agent-wrap package (not enabled") {
			t.Errorf("%s: header %q", f.Path, strings.SplitN(s, "\n", 2)[0])
		}
		want := map[string]string{
			ServiceUnit:     "ExecStart=/usr/bin/agent-wrap --root %h/.agent-runs watchdog --interval 5s\n",
			OnceServiceUnit: "ExecStart=/usr/bin/agent-wrap --root %h/.agent-runs watchdog --once\n",
			TimerUnit:       "Unit=" + OnceServiceUnit + "\n",
		}[name]
		if !strings.Contains(s, want) {
			t.Errorf("%s lacks %q:\n%s", f.Path, want, s)
		}
		if name == ServiceUnit {
			wantedBy := "WantedBy=multi-user.target\n"
			if user {
				wantedBy = "WantedBy=default.target\n"
			}
			if !strings.Contains(s, wantedBy) {
				t.Errorf("%s lacks %q", f.Path, wantedBy)
			}
		}
		if strings.Contains(s, "{{") {
			t.Errorf("%s has an unrendered mark:\n%s", f.Path, s)
		}
	}
	for _, user := range []bool{false, true} {
		b, err := render(ServiceUnit, unitData{Bin: "/b", Root: "/r", User: user})
		if err != nil {
			t.Fatal(err)
		}
		want := "# Installed by 'agent-wrap install --systemd'."
		if user {
			want = "# Installed by 'agent-wrap install --systemd --user'."
		}
		if !strings.HasPrefix(string(b), want) {
			t.Errorf("install's unit (user=%v) starts %q, want %q", user, strings.SplitN(string(b), "\n", 2)[0], want)
		}
	}
}
