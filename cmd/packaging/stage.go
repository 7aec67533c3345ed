// Command packaging stages what `make package` puts in agent-wrap's .deb
// and .rpm, and writes the nfpm configuration that packs it:
//
//	go run ./cmd/packaging -bin dist/agent-wrap-linux-amd64 -arch amd64 -version V -out DIR
//	go tool nfpm package -f DIR/nfpm.yaml -p deb -t dist/
//
// Every file is made from what the binary itself uses: the man page and the
// completions from agent-wrap's command table (help --man, completion), the
// watchdog's units from deploy's units/ (deploy.PackageUnits), and the
// copyright file from the licences of the Go modules the binary links. It
// is a build tool, not part of agent-wrap: nothing under cmd/ imports it,
// and nfpm runs as `go tool nfpm`, so neither enters the binary.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/agent-wrap/agent-wrap/cli"
	"github.com/agent-wrap/agent-wrap/deploy"
)

// Bin is where the package installs agent-wrap: on the PATH sshd gives a
// non-interactive command, so `ssh HOST agent-wrap` finds it.
const Bin = "/usr/bin/agent-wrap"

// MCPBin is where the package installs agent-wrap-mcp, the MCP server
// `agent-wrap mcp` execs (it looks beside agent-wrap first).
const MCPBin = "/usr/bin/agent-wrap-mcp"

// Entry is one file of the package.
type Entry struct {
	Dst      string // the installed path
	Mode     os.FileMode
	Packager string // "deb" or "rpm" for a file only one of them has; "" for both
	License  bool   // rpm: a %license file
	data     []byte
	src      string // a file to copy instead of data
}

// Contents returns the package's files for binary bin, before staging.
func Contents(bin string, o Options) ([]Entry, error) {
	man, err := capture("help", "--man")
	if err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression) // no name, no time: reproducible
	zw.Write(man)
	zw.Close()
	es := []Entry{
		{Dst: Bin, Mode: 0o755, src: bin},
		{Dst: "/usr/share/man/man1/agent-wrap.1.gz", Mode: 0o644, data: gz.Bytes()},
	}
	if o.MCPBin != "" {
		es = append(es, Entry{Dst: MCPBin, Mode: 0o755, src: o.MCPBin})
	}
	for _, c := range []struct{ shell, dst, packager string }{
		{"bash", "/usr/share/bash-completion/completions/agent-wrap", ""},
		// zsh looks in vendor-completions on Debian, site-functions on
		// Fedora and its kin.
		{"zsh", "/usr/share/zsh/vendor-completions/_agent-wrap", "deb"},
		{"zsh", "/usr/share/zsh/site-functions/_agent-wrap", "rpm"},
		{"fish", "/usr/share/fish/vendor_completions.d/agent-wrap.fish", ""},
	} {
		b, err := capture("completion", c.shell)
		if err != nil {
			return nil, err
		}
		es = append(es, Entry{Dst: c.dst, Mode: 0o644, Packager: c.packager, data: b})
	}
	units, err := deploy.PackageUnits(Bin)
	if err != nil {
		return nil, err
	}
	for _, u := range units {
		es = append(es, Entry{Dst: u.Path, Mode: u.Perm, data: u.Data})
	}
	cr, err := copyright(o)
	if err != nil {
		return nil, err
	}
	es = append(es,
		Entry{Dst: "/usr/share/doc/agent-wrap/copyright", Mode: 0o644, Packager: "deb", data: cr},
		Entry{Dst: "/usr/share/licenses/agent-wrap/copyright", Mode: 0o644, Packager: "rpm", License: true, data: cr})
	return es, nil
}

// Files returns the paths packager ("deb" or "rpm") installs, in order.
func Files(es []Entry, packager string) []string {
	var out []string
	for _, e := range es {
		if e.Packager == "" || e.Packager == packager {
			out = append(out, e.Dst)
		}
	}
	return out
}

// capture runs one agent-wrap command line in this process and returns its
// stdout: the same command table the packaged binary has.
func capture(args ...string) ([]byte, error) {
	var out, errb bytes.Buffer
	if code := cli.Run(context.Background(), args, strings.NewReader(""), &out, &errb); code != 0 {
		return nil, fmt.Errorf("agent-wrap %s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	return out.Bytes(), nil
}

// Options are what a package is built with.
type Options struct {
	Bin        string // the agent-wrap binary to ship
	MCPBin     string // the agent-wrap-mcp binary to ship beside it; "": none
	Arch       string // amd64 or arm64 (GOARCH names; nfpm maps them)
	Version    string // as `git describe` says it; see PackageVersion
	Maintainer string
	// Modules are the Go modules the binary links, each "PATH VERSION
	// DIR", for the copyright file; GoRoot is the Go tree's (Linked).
	Modules []string
	GoRoot  string
	// LicenseFile is agent-wrap's own licence text ("" when the source
	// tree has none), LicenseID its SPDX name.
	LicenseFile, LicenseID string
}

// PackageVersion turns what `git describe` prints into a version dpkg and
// rpm both accept and order: a tag's "v" dropped, what is not a tag (a bare
// commit, which may well start with a digit) put after 0.0~git, and every
// "-" a "." (in dpkg, "-" starts the Debian revision; rpm refuses it).
func PackageVersion(v string) string {
	if tagged.MatchString(v) {
		v = strings.TrimPrefix(v, "v")
	} else {
		v = "0.0~git." + v
	}
	return strings.ReplaceAll(v, "-", ".")
}

// tagged matches a version git describe took from a tag: v1.2, 1.2.3-4-gSHA.
var tagged = regexp.MustCompile(`^v?[0-9]+(\.[0-9]+)+([-.+~].*)?$`)

// Stage writes the package's files under dir/root, its scripts under
// dir/scripts and dir/nfpm.yaml, and returns the entries.
func Stage(dir string, o Options) ([]Entry, error) {
	es, err := Contents(o.Bin, o)
	if err != nil {
		return nil, err
	}
	var y strings.Builder
	fmt.Fprintf(&y, `# Written by 'go run ./cmd/packaging' (make package); packed by 'go tool nfpm'.
name: agent-wrap
arch: %s
platform: linux
version: %q
version_schema: none
section: admin
priority: optional
maintainer: %q
homepage: https://github.com/agent-wrap/agent-wrap
license: %q
description: |-
  an honest cancellation contract for commands run over SSH
  agent-wrap runs a command under a renewable lease in a session of its own,
  records everything needed to stop and judge it later (a run directory, a
  status record, a hash-chained journal), and stops its whole process tree
  on cancel, lease expiry or a signal. 'agent-wrap ssh' is the controller
  side. The watchdog's systemd units are installed but not enabled.
contents:
`, o.Arch, PackageVersion(o.Version), o.Maintainer, licenseID(o))
	for i, e := range es {
		src := filepath.Join(dir, "root", fmt.Sprintf("%02d-%s", i, filepath.Base(e.Dst)))
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			return nil, err
		}
		data := e.data
		if e.src != "" {
			if data, err = os.ReadFile(e.src); err != nil {
				return nil, err
			}
		}
		if err := os.WriteFile(src, data, e.Mode); err != nil {
			return nil, err
		}
		if err := os.Chmod(src, e.Mode); err != nil {
			return nil, err
		}
		fmt.Fprintf(&y, "  - src: %q\n    dst: %q\n    file_info:\n      mode: 0%o\n", src, e.Dst, e.Mode)
		if e.Packager != "" {
			fmt.Fprintf(&y, "    packager: %s\n", e.Packager)
		}
		if e.License {
			fmt.Fprintf(&y, "    type: license\n")
		}
	}
	scripts := map[string]string{"postinstall": postinstall(), "preremove": preremove, "postremove": postremove}
	fmt.Fprintf(&y, "scripts:\n")
	for _, name := range []string{"postinstall", "preremove", "postremove"} {
		p := filepath.Join(dir, "scripts", name+".sh")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(scripts[name]), 0o755); err != nil {
			return nil, err
		}
		fmt.Fprintf(&y, "  %s: %q\n", name, p)
	}
	if err := os.WriteFile(filepath.Join(dir, "nfpm.yaml"), []byte(y.String()), 0o644); err != nil {
		return nil, err
	}
	return es, nil
}

// postinstall is the package's post-install script (deb postinst, rpm
// %post): on an upgrade a running watchdog restarts on the new binary;
// then it says how to enable the watchdog, which the package never does.
func postinstall() string {
	var b strings.Builder
	b.WriteString(`#!/bin/sh
# agent-wrap post-install, written by make package. Shell builtins only.
set -e
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || true
	systemctl try-restart ` + deploy.ServiceUnit + ` || true
fi
`)
	lines := []string{
		"agent-wrap: the watchdog's systemd units are installed, not enabled. The watchdog",
		"stops runs whose lease passed while no wrapper enforced it. Enable it with one of:",
	}
	width := 0
	for _, l := range deploy.PackageEnable {
		width = max(width, len(l[0]))
	}
	for _, l := range deploy.PackageEnable {
		lines = append(lines, fmt.Sprintf("  %-*s  # %s", width, l[0], l[1]))
	}
	lines = append(lines, deploy.PackageEnableNote+".")
	for _, l := range lines {
		b.WriteString("printf '%s\\n' " + deploy.ShellQuote(l) + "\n")
	}
	return b.String()
}

// preremove stops and disables the watchdog on a removal (deb prerm
// "remove", rpm %preun 0), not on an upgrade: the units stopped where
// systemd runs, and their links, system and --global, removed in any case
// (systemctl disable works on the files, in a chroot too). A user's own
// `systemctl --user enable` lives in their home; it is theirs to undo.
var preremove = `#!/bin/sh
# agent-wrap pre-remove, written by make package.
case "$1" in
remove|0)
	if command -v systemctl >/dev/null 2>&1; then
		if [ -d /run/systemd/system ]; then
			systemctl stop ` + deploy.ServiceUnit + ` ` + deploy.TimerUnit + ` ` + deploy.OnceServiceUnit + ` >/dev/null 2>&1 || true
		fi
		systemctl disable ` + deploy.ServiceUnit + ` ` + deploy.TimerUnit + ` >/dev/null 2>&1 || true
		systemctl --global disable ` + deploy.ServiceUnit + ` ` + deploy.TimerUnit + ` >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
`

// postremove lets systemd forget the removed units.
var postremove = `#!/bin/sh
# agent-wrap post-remove, written by make package.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
`

// notLicensed is agent-wrap's own licence name while its source tree has
// no LICENSE file.
const notLicensed = "LicenseRef-agent-wrap-no-licence-file"

// licenseID is agent-wrap's own licence name: LicenseID, else the SPDX
// name of the text in LicenseFile where it is one the packager knows.
func licenseID(o Options) string {
	if o.LicenseFile == "" {
		return notLicensed
	}
	if o.LicenseID != "" {
		return o.LicenseID
	}
	if t, err := os.ReadFile(o.LicenseFile); err == nil {
		if id := spdx(string(t)); id != "" {
			return id
		}
	}
	return "LicenseRef-agent-wrap"
}

// copyright writes the machine-readable Debian copyright file
// (copyright-format 1.0): agent-wrap's own stanza, then one per Go module
// the binary links (and one for Go's standard library and runtime), since
// all of them are in /usr/bin/agent-wrap. Each stanza carries its licence
// text whole: two BSD texts name different holders, so none is shared.
func copyright(o Options) ([]byte, error) {
	var b strings.Builder
	b.WriteString("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
	b.WriteString("Upstream-Name: agent-wrap\nSource: https://github.com/agent-wrap/agent-wrap\n")

	own := "The agent-wrap source tree this package was built from has no LICENSE\n" +
		"file, so this package grants no licence for agent-wrap itself. The\n" +
		"licences of the Go modules linked into /usr/bin/agent-wrap follow."
	if o.LicenseFile != "" {
		t, err := os.ReadFile(o.LicenseFile)
		if err != nil {
			return nil, err
		}
		own = strings.TrimLeft(string(t), "\n")
	}
	fmt.Fprintf(&b, "\nFiles: *\nCopyright: the agent-wrap authors\nLicense: %s\n%s", licenseID(o), indent(own))

	type mod struct{ path, version, dir string }
	mods := []mod{{"the Go standard library and runtime", "", o.GoRoot}}
	for _, l := range o.Modules {
		f := strings.Fields(l)
		if len(f) == 3 {
			mods = append(mods, mod{f[0], f[1], f[2]})
		}
	}
	for _, m := range mods {
		text, err := licenseText(m.dir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.path, err)
		}
		id := spdx(text)
		if id == "" {
			id = "LicenseRef-" + strings.NewReplacer("/", "-", " ", "-").Replace(m.path)
		}
		holders := copyrightLines(text)
		if holders == "" {
			holders = "the authors of " + m.path
		}
		files, comment := m.path+"/*", "Go module "+m.path+" "+m.version+", linked into /usr/bin/agent-wrap or /usr/bin/agent-wrap-mcp."
		if m.version == "" {
			files, comment = "go/*", "The Go standard library and runtime, linked into /usr/bin/agent-wrap."
		}
		fmt.Fprintf(&b, "\nFiles: %s\nCopyright: %s\nComment: %s\nLicense: %s\n%s", files, holders, comment, id, indent(text))
	}
	return []byte(b.String()), nil
}

// licenseText reads the licence file at the top of a module.
func licenseText(dir string) (string, error) {
	for _, name := range []string{"LICENSE", "LICENSE.txt", "LICENSE.md", "COPYING", "LICENCE"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			return string(b), nil
		}
	}
	return "", fmt.Errorf("no licence file in %s", dir)
}

// spdx names the three licences the binary's modules use; "" for another.
func spdx(text string) string {
	switch {
	case strings.Contains(text, "Apache License") && strings.Contains(text, "Version 2.0"):
		return "Apache-2.0"
	case strings.Contains(text, "Redistribution and use in source and binary forms") &&
		strings.Contains(text, "Neither the name"):
		return "BSD-3-Clause"
	case strings.Contains(text, "Permission is hereby granted, free of charge"):
		return "MIT"
	}
	return ""
}

// copyrightLines returns a licence's "Copyright ..." lines as one field value.
func copyrightLines(text string) string {
	re := regexp.MustCompile(`(?m)^\s*Copyright (?:\(c\) |©)?\s*(.*\S)\s*$`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		if !strings.Contains(m[1], "[") && !strings.HasPrefix(m[1], "notice") {
			out = append(out, m[1])
		}
	}
	return strings.Join(out, "\n ")
}

// indent makes text a copyright-format continuation: each line after a
// space, an empty line " .".
func indent(text string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		l = strings.TrimRight(l, " \t")
		if l == "" {
			b.WriteString(" .\n")
		} else {
			b.WriteString(" " + l + "\n")
		}
	}
	return b.String()
}

// Linked returns the Go modules ./cmd/agent-wrap and ./cmd/agent-wrap-mcp
// link for linux/arch, each "PATH VERSION DIR", and the GOROOT of the Go
// that builds them: what the copyright file covers. Run inside the module.
func Linked(arch string) (modules []string, goroot string, err error) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}",
		"github.com/agent-wrap/agent-wrap/cmd/agent-wrap", "github.com/agent-wrap/agent-wrap/cmd/agent-wrap-mcp")
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("go list -deps ./cmd/agent-wrap ./cmd/agent-wrap-mcp: %w", err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !seen[l] {
			seen[l] = true
			modules = append(modules, l)
		}
	}
	g, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return nil, "", fmt.Errorf("go env GOROOT: %w", err)
	}
	return modules, strings.TrimSpace(string(g)), nil
}

func main() {
	var o Options
	out := flag.String("out", "", "the staging `DIR` (made if missing)")
	flag.StringVar(&o.Bin, "bin", "", "the agent-wrap `BINARY` to ship")
	flag.StringVar(&o.MCPBin, "mcp-bin", "", "the agent-wrap-mcp `BINARY` to ship beside it (none: not shipped)")
	flag.StringVar(&o.Arch, "arch", "", "amd64 or arm64")
	flag.StringVar(&o.Version, "version", "", "the version, as git describe prints it")
	flag.StringVar(&o.Maintainer, "maintainer", "", "the package's Maintainer: field")
	flag.StringVar(&o.LicenseFile, "license-file", "", "agent-wrap's licence `FILE` (none: the package says there is none)")
	flag.StringVar(&o.LicenseID, "license", "", "the SPDX name of -license-file (default: read from its text)")
	flag.Parse()
	if *out == "" || o.Bin == "" || o.Arch == "" || o.Version == "" {
		fmt.Fprintln(os.Stderr, "packaging: -out, -bin, -arch and -version are required")
		os.Exit(64)
	}
	var err error
	if o.Modules, o.GoRoot, err = Linked(o.Arch); err != nil {
		fatal(err)
	}
	if _, err := Stage(*out, o); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "staged %s/nfpm.yaml\n", *out)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "packaging:", err)
	os.Exit(1)
}
