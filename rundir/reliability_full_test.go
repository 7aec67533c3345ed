//go:build linux

package rundir_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// On a full file system a temp file gets no blocks, but the file being
// replaced has them: WriteAtomic overwrites it in place, so a record (a
// few fields longer) still lands; a file that does not exist yet still
// fails with ENOSPC, and no temp file is left either way.
func TestWriteAtomicOnAFullDiskOverwritesInPlace(t *testing.T) {
	mnt := runtest.Tmpfs(t, 256<<10)
	d := runtest.RunDirAt(t, filepath.Join(mnt, "runs"), "full")
	if err := d.WriteAtomic("status.json", []byte(`{"state":"running"}`+"\n"), rundir.Synced); err != nil {
		t.Fatal(err)
	}
	runtest.Fill(t, mnt)
	final := []byte(`{"state":"cancelled","exit_code":124,"survivors":[]}` + "\n")
	if err := d.WriteAtomic("status.json", final, rundir.Durable); err != nil {
		t.Fatalf("WriteAtomic of an existing file on a full disk: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(d.Path, "status.json")); string(b) != string(final) {
		t.Fatalf("status.json holds %q", b)
	}
	shorter := []byte("{}\n")
	if err := d.WriteAtomic("status.json", shorter, rundir.Synced); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(d.Path, "status.json")); string(b) != string(shorter) {
		t.Fatalf("a shorter record left the old tail: %q", b)
	}
	if err := d.WriteAtomic("new", []byte("x"), rundir.Synced); !rundir.NoSpace(err) {
		t.Fatalf("WriteAtomic of a new file on a full disk: %v, want ENOSPC", err)
	}
	if m, _ := filepath.Glob(filepath.Join(d.Path, ".*")); len(m) > 0 {
		t.Fatalf("temp files left: %v", m)
	}
}

// On a full file system a record that has grown past the blocks its file
// has cannot land in place: WriteAtomic then fails with ENOSPC and leaves
// the old record whole, never a cut prefix of the new one (found by the
// chaos campaign: a walker's final record, long with the escapes it lists,
// written while the tmpfs was full, was left unreadable).
func TestWriteAtomicOnAFullDiskNeverCutsARecordThatGrew(t *testing.T) {
	mnt := runtest.Tmpfs(t, 256<<10)
	d := runtest.RunDirAt(t, filepath.Join(mnt, "runs"), "grown")
	old := []byte(`{"state":"running"}` + "\n")
	if err := d.WriteAtomic("status.json", old, rundir.Synced); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(d.Path, "status.json"), &st); err != nil {
		t.Fatal(err)
	}
	runtest.Fill(t, mnt)
	grown := []byte(`{"state":"cancelled","escaped":"` + strings.Repeat("x", int(st.Blocks*512)) + `"}` + "\n")
	if err := d.WriteAtomic("status.json", grown, rundir.Durable); !rundir.NoSpace(err) {
		t.Fatalf("WriteAtomic of %d bytes over a file of %d blocks on a full disk: %v, want ENOSPC", len(grown), st.Blocks, err)
	}
	if b, _ := os.ReadFile(filepath.Join(d.Path, "status.json")); string(b) != string(old) {
		t.Fatalf("status.json holds %d bytes, want the old record whole: %.80q", len(b), b)
	}
	if m, _ := filepath.Glob(filepath.Join(d.Path, ".*")); len(m) > 0 {
		t.Fatalf("temp files left: %v", m)
	}
}

// RemoveStaleTemps removes the temp file of a writer that died before its
// rename (its PID in the name no longer runs), and keeps that of a writer
// that lives, even a stopped one.
func TestRemoveStaleTempsKeepsLiveWriters(t *testing.T) {
	root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	d, err := root.Create("temps")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	live := runtest.Spawn(t, nil, "sleep", "300")
	deadTemp := ".status.json." + strconv.Itoa(dead.Process.Pid) + ".abc"
	liveTemp := ".status.json." + strconv.Itoa(live.PID) + ".def"
	other := ".deadline_epoch." + strconv.Itoa(dead.Process.Pid) + ".ghi"
	for _, n := range []string{deadTemp, liveTemp, other} {
		if err := os.WriteFile(filepath.Join(d.Path, n), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := d.RemoveStaleTemps("status.json")
	if err != nil || len(removed) != 1 || removed[0] != deadTemp {
		t.Fatalf("RemoveStaleTemps: %v, %v; want [%s]", removed, err, deadTemp)
	}
	for _, n := range []string{liveTemp, other} {
		if !d.Exists(n) {
			t.Fatalf("%s was removed", n)
		}
	}
}
