package main

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/deploy"
)

// need returns the path of each program, failing (not skipping) when one
// is missing: .ci/deps installs them.
func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is not installed: %v; hint: make deps (dpkg, rpm, systemd, groff)", p, err)
		}
	}
}

// run runs a command and returns its stdout; a failure, or anything on
// stderr when quiet is set, fails the test.
func run(t *testing.T, quiet bool, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil || quiet && errb.Len() != 0 {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

const testVersion = "v1.2.3-4-gabcdef0"

// buildPackages builds agent-wrap for linux/amd64 as make does, stages it
// and packs a .deb and an .rpm with `go tool nfpm`. (make package builds
// arm64 too; one architecture is enough to test what is packed.)
func buildPackages(t *testing.T) (es []Entry, deb, rpm string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "agent-wrap")
	cmd := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-s -w -X github.com/agent-wrap/agent-wrap/cli.version="+testVersion,
		"-o", bin, "github.com/agent-wrap/agent-wrap/cmd/agent-wrap")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mods, goroot, err := Linked("amd64")
	if err != nil {
		t.Fatal(err)
	}
	// The licence as make package passes it: the tree's LICENSE under the
	// Makefile's LICENSE_ID.
	licID := strings.TrimSpace(run(t, false, "make", "-s", "--no-print-directory", "-C", "../..",
		"--eval", "print-license-id: ; @echo $(LICENSE_ID)", "print-license-id"))
	stage := filepath.Join(dir, "stage")
	es, err = Stage(stage, Options{Bin: bin, Arch: "amd64", Version: testVersion,
		Maintainer: "Test Maintainer <test@example.invalid>", Modules: mods, GoRoot: goroot,
		LicenseFile: filepath.Join("..", "..", "LICENSE"), LicenseID: licID})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"deb", "rpm"} {
		run(t, false, "go", "tool", "nfpm", "package", "-f", filepath.Join(stage, "nfpm.yaml"), "-p", p, "-t", out)
	}
	deb = filepath.Join(out, "agent-wrap_1.2.3.4.gabcdef0_amd64.deb")
	rpm = filepath.Join(out, "agent-wrap-1.2.3.4.gabcdef0-1.x86_64.rpm")
	for _, f := range []string{deb, rpm} {
		if _, err := os.Stat(f); err != nil {
			ls, _ := os.ReadDir(out)
			t.Fatalf("%v (made: %v)", err, ls)
		}
	}
	return es, deb, rpm
}

// TestPackage builds the .deb and the .rpm, reads both back with dpkg-deb
// and rpm, installs the .deb with a real dpkg into a scratch root (its
// maintainer scripts run there, chrooted, under a real /bin/sh with a real
// systemctl), checks every file and that nothing was enabled, verifies the
// installed units with systemd-analyze, enables the watchdog as an
// administrator would, then removes and purges the package and checks that
// the watchdog was disabled and nothing of the package is left.
func TestPackage(t *testing.T) {
	need(t, "go", "dpkg", "dpkg-deb", "rpm", "systemd-analyze", "unshare", "groff")
	es, deb, rpm := buildPackages(t)
	debFiles, rpmFiles := Files(es, "deb"), Files(es, "rpm")

	t.Run("binary", func(t *testing.T) {
		for _, e := range es {
			if e.Dst != Bin {
				continue
			}
			fi, err := os.Stat(e.src)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() > 10<<20 {
				t.Errorf("agent-wrap is %d bytes, over 10 MiB", fi.Size())
			}
			f, err := elf.Open(e.src)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("agent-wrap is not static: it has a %v program header", p.Type)
				}
			}
		}
	})

	t.Run("deb-info", func(t *testing.T) {
		info := run(t, true, "dpkg-deb", "--info", deb)
		for _, want := range []string{" Package: agent-wrap\n", " Version: 1.2.3.4.gabcdef0\n", " Architecture: amd64\n",
			" Maintainer: Test Maintainer <test@example.invalid>\n", " Section: admin\n", " postinst ", " prerm ", " postrm "} {
			if !strings.Contains(info, want) {
				t.Errorf("dpkg-deb --info lacks %q:\n%s", want, info)
			}
		}
	})

	t.Run("deb-contents", func(t *testing.T) {
		var files []string
		for _, l := range strings.Split(strings.TrimSpace(run(t, true, "dpkg-deb", "--contents", deb)), "\n") {
			f := strings.Fields(l)
			if len(f) != 6 {
				t.Fatalf("dpkg-deb --contents line %q", l)
			}
			path := strings.TrimPrefix(f[5], ".")
			if f[1] != "root/root" {
				t.Errorf("%s is owned by %s, want root/root", path, f[1])
			}
			switch f[0][0] {
			case 'd':
				continue
			case '-':
			default:
				t.Errorf("%s: not a file or a directory: %s", path, f[0])
			}
			want := "-rw-r--r--"
			if path == Bin {
				want = "-rwxr-xr-x"
			}
			if f[0] != want {
				t.Errorf("%s: mode %s, want %s", path, f[0], want)
			}
			files = append(files, path)
		}
		if !sameSet(files, debFiles) {
			t.Errorf("dpkg-deb --contents lists\n%s\nwant\n%s", strings.Join(files, "\n"), strings.Join(debFiles, "\n"))
		}
	})

	t.Run("rpm", func(t *testing.T) {
		files := strings.Split(strings.TrimSpace(run(t, true, "rpm", "-qlp", rpm)), "\n")
		if !sameSet(files, rpmFiles) {
			t.Errorf("rpm -qlp lists\n%s\nwant\n%s", strings.Join(files, "\n"), strings.Join(rpmFiles, "\n"))
		}
		// The same files as the .deb but for the two each family keeps
		// elsewhere: zsh's vendor directory and the licence.
		elsewhere := map[string]string{
			"/usr/share/zsh/site-functions/_agent-wrap": "/usr/share/zsh/vendor-completions/_agent-wrap",
			"/usr/share/licenses/agent-wrap/copyright":  "/usr/share/doc/agent-wrap/copyright",
		}
		var asDeb []string
		for _, f := range files {
			if d, ok := elsewhere[f]; ok {
				f = d
			}
			asDeb = append(asDeb, f)
		}
		if !sameSet(asDeb, debFiles) {
			t.Errorf("the .rpm and the .deb differ: rpm %v, deb %v", files, debFiles)
		}
		q := run(t, true, "rpm", "-qp", "--queryformat", "%{NAME} %{VERSION} %{ARCH}", rpm)
		if q != "agent-wrap 1.2.3.4.gabcdef0 x86_64" {
			t.Errorf("rpm -qp: %q", q)
		}
		lic := run(t, true, "rpm", "-qLp", rpm)
		if strings.TrimSpace(lic) != "/usr/share/licenses/agent-wrap/copyright" {
			t.Errorf("rpm -qLp (licence files): %q", lic)
		}
		if l := run(t, true, "rpm", "-qp", "--queryformat", "%{LICENSE}", rpm); l != "Apache-2.0" {
			t.Errorf("rpm -qp %%{LICENSE}: %q, want Apache-2.0", l)
		}
		scripts := run(t, true, "rpm", "-qp", "--scripts", rpm)
		for _, want := range []string{"postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet", "installed, not enabled"} {
			if !strings.Contains(scripts, want) {
				t.Errorf("rpm --scripts lacks %q:\n%s", want, scripts)
			}
		}
	})

	t.Run("dpkg-install-remove", func(t *testing.T) {
		root := scratchRoot(t)
		before := tree(t, root)
		dpkg := func(args ...string) string {
			t.Helper()
			return run(t, true, "dpkg", append([]string{"--root=" + root, "--log=" + filepath.Join(t.TempDir(), "dpkg.log")}, args...)...)
		}
		out := dpkg("-i", deb)
		for _, want := range []string{"Setting up agent-wrap (1.2.3.4.gabcdef0)", "installed, not enabled"} {
			if !strings.Contains(out, want) {
				t.Errorf("dpkg -i says no %q:\n%s", want, out)
			}
		}
		for _, l := range deploy.PackageEnable {
			if !strings.Contains(out, l[0]) {
				t.Errorf("the post-install message lacks %q:\n%s", l[0], out)
			}
		}
		if st := dpkg("-s", "agent-wrap"); !strings.Contains(st, "Status: install ok installed") {
			t.Errorf("dpkg -s:\n%s", st)
		}
		for _, e := range es {
			if e.Packager == "rpm" {
				continue
			}
			got, err := os.ReadFile(filepath.Join(root, e.Dst))
			if err != nil {
				t.Fatal(err)
			}
			want := e.data
			if e.src != "" {
				want, _ = os.ReadFile(e.src)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from what was packed", e.Dst)
			}
		}
		// The binary that was installed runs, and is the version packed.
		if v := run(t, true, filepath.Join(root, Bin), "version"); !strings.HasPrefix(v, "agent-wrap "+testVersion+" ") {
			t.Errorf("installed agent-wrap version: %q", v)
		}
		// The man page unpacks and renders without a warning.
		zr, err := gzip.NewReader(bytes.NewReader(mustRead(t, filepath.Join(root, "usr/share/man/man1/agent-wrap.1.gz"))))
		if err != nil {
			t.Fatal(err)
		}
		page, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("groff", "-man", "-Tutf8", "-ww", "-z")
		cmd.Stdin = bytes.NewReader(page)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
			t.Errorf("groff on the installed man page: %v\n%s", err, out)
		}
		// The copyright file: copyright-format 1.0, a stanza with its
		// licence text for agent-wrap and for each module the binary links.
		cr := string(mustRead(t, filepath.Join(root, "usr/share/doc/agent-wrap/copyright")))
		mods, _, err := Linked("amd64")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(cr, "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n") ||
			!strings.Contains(cr, "\nFiles: *\n") || !strings.Contains(cr, "\nFiles: go/*\n") || len(mods) < 3 {
			t.Errorf("copyright (modules %v):\n%s", mods, cr)
		}
		// agent-wrap's own stanza: the Apache License 2.0, its text whole.
		own, _, _ := strings.Cut(cr[strings.Index(cr, "\nFiles: *\n")+1:], "\n\n")
		if !regexp.MustCompile(`^Files: \*\nCopyright: .+\nLicense: Apache-2.0\n +Apache License\n +Version 2\.0, January 2004\n`).MatchString(own) ||
			!regexp.MustCompile(`\n +END OF TERMS AND CONDITIONS\n`).MatchString(own) {
			t.Errorf("copyright: agent-wrap's own stanza is not the Apache License 2.0 with its text:\n%.600s", own)
		}
		for _, m := range mods {
			path := strings.Fields(m)[0]
			i := strings.Index(cr, "\nFiles: "+path+"/*\n")
			if i < 0 {
				t.Errorf("copyright has no stanza for %s", path)
				continue
			}
			stanza, _, _ := strings.Cut(cr[i+1:], "\n\n")
			if !regexp.MustCompile(`\nLicense: (BSD-3-Clause|Apache-2.0|MIT)\n [^\n]+\n`).MatchString(stanza) {
				t.Errorf("copyright stanza of %s has no licence with its text:\n%.400s", path, stanza)
			}
		}
		// Installed, not enabled: no unit is linked into any .wants.
		if _, err := os.Stat(filepath.Join(root, "etc/systemd")); !os.IsNotExist(err) {
			t.Errorf("the package enabled something: %s/etc/systemd exists (%v)", root, err)
		}

		verifyUnits(t, root)

		// An administrator enables the watchdog, system and for every user,
		// as the post-install message says (offline, on the files: no
		// systemd runs here). Removing the package must undo both.
		links := []string{"etc/systemd/system/multi-user.target.wants/" + deploy.ServiceUnit,
			"etc/systemd/user/default.target.wants/" + deploy.ServiceUnit}
		run(t, false, "systemctl", "--root="+root, "enable", deploy.ServiceUnit)
		run(t, false, "systemctl", "--root="+root, "--global", "enable", deploy.ServiceUnit)
		for _, l := range links {
			if _, err := os.Lstat(filepath.Join(root, l)); err != nil {
				t.Fatalf("systemctl enable made no %s: %v", l, err)
			}
		}

		dpkg("-r", "agent-wrap")
		for _, l := range links {
			if _, err := os.Lstat(filepath.Join(root, l)); !os.IsNotExist(err) {
				t.Errorf("%s is still there after dpkg -r: the pre-remove did not disable the unit (%v)", l, err)
			}
		}
		for _, f := range debFiles {
			if _, err := os.Lstat(filepath.Join(root, f)); !os.IsNotExist(err) {
				t.Errorf("%s is still there after dpkg -r (%v)", f, err)
			}
		}
		dpkg("-P", "agent-wrap")
		cmd = exec.Command("dpkg", "--root="+root, "-s", "agent-wrap")
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "is not installed") {
			t.Errorf("dpkg -s after the purge: %v\n%s", err, out)
		}
		// Nothing of the package is left: the tree is what it was but for
		// dpkg's own records and the directories systemctl enable made.
		var left []string
		for _, p := range tree(t, root) {
			if !slices.Contains(before, p) && !strings.HasPrefix(p, "var/lib/dpkg/") && !noFiles(filepath.Join(root, p)) {
				left = append(left, p)
			}
		}
		if len(left) > 0 {
			t.Errorf("left behind after dpkg -r and -P: %v", left)
		}
	})
}

// verifyUnits runs systemd-analyze verify on the units as installed under
// root, system and user. ExecStart names /usr/bin/agent-wrap, which verify
// checks; so it runs in a private mount namespace whose /usr/bin is an
// overlay of root's over the host's: the installed binary is where the
// units say, the host's /usr/bin is untouched, and systemd-analyze still
// finds its own units. verify exits 0 on mere warnings, so any output fails.
func verifyUnits(t *testing.T, root string) {
	t.Helper()
	rt := t.TempDir() // a user-mode verify needs a runtime directory
	if err := os.Chmod(rt, 0o700); err != nil {
		t.Fatal(err)
	}
	sys, _ := filepath.Glob(filepath.Join(root, deploy.PackageSystemUnitDir, "*"))
	usr, _ := filepath.Glob(filepath.Join(root, deploy.PackageUserUnitDir, "*"))
	if len(sys) != 3 || len(usr) != 3 {
		t.Fatalf("installed units: system %v, user %v; want 3 of each", sys, usr)
	}
	script := `set -e
mount --make-rprivate /
mount -t overlay overlay -o lowerdir="$1/usr/bin":/usr/bin /usr/bin
test -x /usr/bin/agent-wrap
shift
systemd-analyze verify "$@"
`
	userScript := strings.Replace(script, "systemd-analyze verify", "systemd-analyze --user verify", 1)
	for _, tc := range []struct {
		script string
		units  []string
	}{{script, sys}, {userScript, usr}} {
		cmd := exec.Command("unshare", append([]string{"--mount", "sh", "-c", tc.script, "sh", root}, tc.units...)...)
		cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+rt, "SYSTEMD_LOG_LEVEL=notice")
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("systemd-analyze verify %v: %v\n%s", tc.units, err, out)
		}
	}
}

// scratchRoot makes a root directory for dpkg --root: dpkg's database
// (empty), and what the maintainer scripts need once dpkg has chrooted
// into it: /bin/sh and systemctl (the host's, with the libraries they
// load) and /dev/null.
func scratchRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "bin", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	systemctl, err := exec.LookPath("systemctl")
	if err != nil {
		t.Fatalf("systemctl: %v; hint: apt-get install systemd", err)
	}
	for prog, dst := range map[string]string{"/bin/sh": "bin/sh", systemctl: "bin/systemctl"} {
		real, err := filepath.EvalSymlinks(prog)
		if err != nil {
			t.Fatal(err)
		}
		copyFile(t, real, filepath.Join(root, dst), 0o755)
		copyLibs(t, real, root)
	}
	if err := unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatalf("mknod dev/null: %v", err)
	}
	return root
}

// copyLibs copies what the dynamic loader needs to run prog (its loader
// and the libraries ldd resolves) to the same paths under root.
func copyLibs(t *testing.T, prog, root string) {
	t.Helper()
	f, err := elf.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			interp := strings.TrimRight(string(b), "\x00")
			copyFile(t, interp, filepath.Join(root, interp), 0o755)
		}
	}
	for _, l := range strings.Split(run(t, true, "ldd", prog), "\n") {
		if i := strings.Index(l, "=> /"); i >= 0 {
			lib := strings.Fields(l[i+3:])[0]
			copyFile(t, lib, filepath.Join(root, lib), 0o755)
		}
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, mustRead(t, src), mode); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tree lists every path under root, relative.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(root, p); rel != "." {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noFiles reports whether p is a directory with no files anywhere below it.
func noFiles(p string) bool {
	none := true
	err := filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			none = false
		}
		return err
	})
	return err == nil && none
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// PackageVersion: what git describe prints becomes a version both dpkg
// and rpm take; a bare commit (which may start with a digit) sorts before
// any release.
func TestPackageVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":            "1.2.3",
		"v1.2.3-4-gabcdef0": "1.2.3.4.gabcdef0",
		"1.0":               "1.0",
		"35d2dac":           "0.0~git.35d2dac",
		"35d2dac-dirty":     "0.0~git.35d2dac.dirty",
		"abc1234":           "0.0~git.abc1234",
	} {
		if got := PackageVersion(in); got != want {
			t.Errorf("PackageVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLicenseIsApache: the tree's LICENSE is the Apache License 2.0 as
// Debian ships it in common-licenses, and the packager names it so even
// when no SPDX name is given.
func TestLicenseIsApache(t *testing.T) {
	got := mustRead(t, filepath.Join("..", "..", "LICENSE"))
	if want, err := os.ReadFile("/usr/share/common-licenses/Apache-2.0"); err == nil && !bytes.Equal(got, want) {
		t.Errorf("LICENSE differs from /usr/share/common-licenses/Apache-2.0")
	}
	if !bytes.Contains(got, []byte("Apache License\n")) || !bytes.Contains(got, []byte("Version 2.0, January 2004")) {
		t.Errorf("LICENSE is not the Apache License 2.0:\n%.300s", got)
	}
	if id := licenseID(Options{LicenseFile: filepath.Join("..", "..", "LICENSE")}); id != "Apache-2.0" {
		t.Errorf("licenseID of LICENSE with no SPDX name given: %q, want Apache-2.0", id)
	}
}
