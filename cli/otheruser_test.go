//go:build linux

package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A run directory in your root that another user owns is refused with 78,
// naming its owner, whether its mode lets you read it (0755) or not (0700,
// the mode every run directory has): status and cancel say the same, and
// nothing is changed. (reconcile judges such a run unknown, as it judges
// every run directory it cannot trust.) Run as nobody, over directories root owns.
func TestOtherUsersRunDirNamesTheOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test makes directories owned by another user: run it as root")
	}
	base, bin := nobodysBinary(t, "aw-otheruser-")
	// nobody's root, holding two run directories of root's.
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(root, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for id, mode := range map[string]os.FileMode{"private": 0o700, "readable": 0o755} {
		d := filepath.Join(root, id)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "status.json"), []byte(`{"schema":1}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"private", "readable"} {
		for _, cmd := range [][]string{{"status", id}, {"cancel", "--wait", "1s", id}} {
			code, stderr := asUser(t, bin, append([]string{"--root", root}, cmd...)...)
			want := "run directory " + filepath.Join(root, id) + " is owned by uid 0, not by you (uid 65534)"
			if code != 78 || !strings.Contains(stderr, want) || strings.Contains(stderr, "permission denied") {
				t.Errorf("%s: exit %d, stderr:\n%s\nwant 78 and %q", strings.Join(cmd, " "), code, stderr, want)
			}
		}
		if st, err := os.Stat(filepath.Join(root, id, "status.json")); err != nil || st.Size() != int64(len(`{"schema":1}`)) {
			t.Errorf("%s/status.json changed: %v", id, err)
		}
	}
}
