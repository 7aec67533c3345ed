package rundir_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/rundir"
)

// Open judges a run directory whole: any of its files that is a symlink,
// not a regular file or writable by group or others makes the run unsafe,
// whichever file the caller meant to use.
func TestOpenRefusesTamperedFiles(t *testing.T) {
	for _, name := range []string{"status.json", "events.jsonl", "lock", "pid", "pgid", "deadline_epoch", "stdout.log", "stderr.log"} {
		for _, how := range []string{"symlink", "mode0660", "mode0602", "fifo"} {
			t.Run(name+"/"+how, func(t *testing.T) {
				root, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
				if err != nil {
					t.Fatal(err)
				}
				defer root.Close()
				d, err := root.Create("run-1")
				if err != nil {
					t.Fatal(err)
				}
				d.Close()
				p := filepath.Join(d.Path, name)
				switch how {
				case "symlink":
					target := filepath.Join(t.TempDir(), "target")
					os.WriteFile(target, nil, 0o600)
					err = os.Symlink(target, p)
				case "mode0660", "mode0602":
					if err = os.WriteFile(p, nil, 0o600); err == nil {
						err = os.Chmod(p, map[string]os.FileMode{"mode0660": 0o660, "mode0602": 0o602}[how])
					}
				case "fifo":
					err = unix.Mkfifo(p, 0o600)
				}
				if err != nil {
					t.Fatal(err)
				}
				if _, err := root.Open("run-1"); !errors.Is(err, rundir.ErrUnsafe) {
					t.Fatalf("Open with %s %s: %v, want ErrUnsafe", name, how, err)
				}
			})
		}
	}
}
