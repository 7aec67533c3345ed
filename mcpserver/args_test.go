package mcpserver

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// withStdin's line, run by a real sh as the host runs it: the job reads
// the text exactly, then end of file, and its argv arrives word for word.
func TestWithStdinThroughShell(t *testing.T) {
	for _, stdin := range []string{"one line\n", "no newline", "-n", "%s %d \\n", "two\nlines\n", strings.Repeat("x", maxStdin)} {
		argv, err := withStdin([]string{"sh", "-c", `cat; printf '|%s' "$@"`, "sh", "a b", "-c"}, stdin)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(argv[0], argv[1:]...).Output()
		if err != nil {
			t.Fatalf("%q: %v", argv, err)
		}
		if want := stdin + "|a b|-c"; string(out) != want {
			t.Errorf("stdin %.40q: the job read and was given %.80q, want %.80q", stdin, out, want)
		}
	}
	if argv, _ := withStdin([]string{"true"}, ""); len(argv) != 1 {
		t.Errorf("no stdin: argv %q, want the command alone", argv)
	}
	for _, bad := range []string{"nul\x00byte", strings.Repeat("x", maxStdin+1)} {
		if _, err := withStdin([]string{"cat"}, bad); err == nil || !strings.Contains(err.Error(), "stdin") {
			t.Errorf("stdin of %d bytes with NUL=%v: err %v, want a refusal naming stdin", len(bad), strings.Contains(bad, "\x00"), err)
		}
	}
}

func TestRunArguments(t *testing.T) {
	for _, tc := range []struct {
		in   RunIn
		want string // "" ok, else in the error
	}{
		{RunIn{Argv: []string{"true"}}, ""},
		{RunIn{Command: "echo hi"}, ""},
		{RunIn{}, "no command"},
		{RunIn{Command: "  "}, "no command"},
		{RunIn{Argv: []string{"true"}, Command: "true"}, "both"},
		{RunIn{Argv: []string{""}}, "argv[0]"},
	} {
		_, err := commandOf(tc.in)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("commandOf(%+v) = %v, want %q", tc.in, err, tc.want)
		}
	}
	for dest, ok := range map[string]bool{"build@ci7": true, "host": true, "": false, "-oProxyCommand=x": false, "a b": false, "a\nb": false} {
		if err := checkDest(dest); (err == nil) != ok {
			t.Errorf("checkDest(%q) = %v", dest, err)
		}
	}
}

// A stream whose file stops keeping bytes (a full disk, here a file made
// read-only under it) counts on, so offsets stay the host's, and refuses
// to read past the first byte lost instead of giving a hole as output.
func TestStreamLostBytesRefused(t *testing.T) {
	st, err := newStream(t.TempDir()+"/out", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	st.Write([]byte("kept\n"))
	ro, err := os.Open(st.f.Name())
	if err != nil {
		t.Fatal(err)
	}
	st.f.Close()
	st.f = ro // writes now fail, as on a full disk
	st.Write([]byte("lost\n"))
	st.Write([]byte("more\n"))
	if n := st.size(); n != 15 {
		t.Errorf("size %d, want 15: every byte delivered counts", n)
	}
	if b, err := st.read(0, 100); err != nil || string(b) != "kept\n" {
		t.Errorf("read(0) = %q, %v; want the kept bytes alone", b, err)
	}
	if _, err := st.read(5, 100); err == nil || !strings.Contains(err.Error(), "byte 5") {
		t.Errorf("read(5) = %v; want an error naming byte 5", err)
	}
}
