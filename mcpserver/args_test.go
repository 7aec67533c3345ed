package mcpserver

import (
	"os"
	"strings"
	"testing"
)

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
