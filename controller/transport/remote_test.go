package transport

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// hostile is the argv a remote call must deliver exactly.
var hostile = []string{"two words", `it's "quoted"`, "$HOME", "a;b", `back\slash`, "line\nbreak", "", "-n", "--", "\xff\xfe\x80", "*", "`id`", "'", "\t"}

// TestQuoteThroughShell hands Quote's line to a real POSIX shell, as sshd
// hands it to the login shell, and checks each word arrives byte for byte.
func TestQuoteThroughShell(t *testing.T) {
	for _, shell := range []string{"/bin/sh", "/bin/bash"} {
		line := Quote(append([]string{"printf", `%s\000`}, hostile...)...)
		out, err := exec.Command(shell, "-c", line).Output()
		if err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if !reflect.DeepEqual(got, hostile) {
			t.Errorf("%s: got %q, want %q", shell, got, hostile)
		}
	}
}

func TestSplitCommand(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"ssh", []string{"ssh"}},
		{"  ssh  -p 2222 ", []string{"ssh", "-p", "2222"}},
		{`ssh -o 'ProxyCommand=nc %h %p'`, []string{"ssh", "-o", "ProxyCommand=nc %h %p"}},
		{`ssh -o "A=b c" -i\ x`, []string{"ssh", "-o", "A=b c", "-i x"}},
		{`ssh ""`, []string{"ssh", ""}},
		{`a"b\"c"d`, []string{`ab"cd`}},
	} {
		got, err := SplitCommand(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("SplitCommand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "   ", "ssh 'x", `ssh "x`} {
		if _, err := SplitCommand(bad); err == nil {
			t.Errorf("SplitCommand(%q): no error", bad)
		}
	}
}

func TestConfigMentions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	os.Mkdir(filepath.Join(dir, "conf.d"), 0o700)
	write("conf.d/a.conf", "Host x\n  ServerAliveInterval 30\n")
	plain := write("plain", "Host *\n  User me\n")
	direct := write("direct", "Host *\n  serveraliveinterval=5\n")
	incl := write("incl", "Include "+filepath.Join(dir, "conf.d", "*.conf")+"\n")
	token := write("token", "Include ~/.ssh/%h.conf\n")
	for _, tc := range []struct {
		rsh  []string
		want int
	}{
		{[]string{"ssh", "-F", plain}, notMentioned},
		{[]string{"ssh", "-F", direct}, mentioned},
		{[]string{"ssh", "-F" + incl}, mentioned},
		{[]string{"ssh", "-F", token}, cannotTell},
		{[]string{"ssh", "-F", "/dev/null"}, notMentioned},
		{[]string{"ssh", "-F", filepath.Join(dir, "missing")}, notMentioned},
		{[]string{"ssh", "-qF", plain}, cannotTell},
	} {
		if got := configMentions(tc.rsh, "serveraliveinterval"); got != tc.want {
			t.Errorf("configMentions(%q) = %d, want %d", tc.rsh, got, tc.want)
		}
	}
}

// A call's client reads the bytes given as Call.Input, then EOF; any other
// call's stdin is /dev/null (empty, not the controller's own stdin).
func TestCallStdin(t *testing.T) {
	dir := t.TempDir()
	// RSH DEST LINE: sh -c 'cat > "$0"' DEST LINE: the "destination" is
	// the file the client's stdin goes to.
	h := &Host{rsh: []string{"/bin/sh", "-c", `cat > "$0"`}, probed: make(chan struct{}), tmpdir: dir}
	close(h.probed)
	with := filepath.Join(dir, "with")
	h.dest = with
	if res := h.Call(context.Background(), Call{Line: "x", Input: []byte("line one\nline two\n"), Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}); res.Code != 0 {
		t.Fatalf("call: %+v", res)
	}
	if b, _ := os.ReadFile(with); string(b) != "line one\nline two\n" {
		t.Errorf("the client read %q", b)
	}
	without := filepath.Join(dir, "without")
	h.dest = without
	if res := h.Call(context.Background(), Call{Line: "x", Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}); res.Code != 0 {
		t.Fatalf("call: %+v", res)
	}
	if b, err := os.ReadFile(without); err != nil || len(b) != 0 {
		t.Errorf("a call without stdin read %q (%v), want nothing", b, err)
	}
}
