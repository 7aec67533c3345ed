package watchdog_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/watchdog"
)

// A run directory whose wrapper has made it and not yet written its first
// record is passed without a word; one that has had no record for longer
// than that is still reported (skipped, naming the missing file).
func TestPassIsSilentOnARunBeingCreated(t *testing.T) {
	t.Parallel()
	root := openRoot(t, runtest.NewRoot(t))
	if err := os.Mkdir(filepath.Join(root.Path, "new-run"), 0o700); err != nil {
		t.Fatal(err)
	}
	acts, err := watchdog.Pass(root, watchdog.Options{})
	if err != nil || len(acts) != 0 {
		t.Fatalf("Pass over a run being created = %+v, %v; want nothing said", acts, err)
	}

	old := filepath.Join(root.Path, "old-run")
	if err := os.Mkdir(old, 0o700); err != nil {
		t.Fatal(err)
	}
	then := time.Now().Add(-time.Minute)
	if err := os.Chtimes(old, then, then); err != nil {
		t.Fatal(err)
	}
	acts, err = watchdog.Pass(root, watchdog.Options{})
	if err != nil || len(acts) != 1 || acts[0].RunID != "old-run" || acts[0].Action != "skipped" || !strings.Contains(acts[0].Reason, "status.json") {
		t.Fatalf("Pass over a run a minute without a record = %+v, %v; want it skipped, naming status.json", acts, err)
	}
}
