package statusfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/rundir"
)

func TestRoundTrip(t *testing.T) {
	r, err := rundir.OpenRoot(filepath.Join(t.TempDir(), "runs"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d, _ := r.Create("rt")
	defer d.Close()
	rec := &Record{RunID: "rt", State: Running, PID: 10, PGID: 10, SID: 10, WrapperPID: 9, BootID: "b",
		Command: []string{"sh", "-c", "a && b"}, CreatedAt: "2026-01-01T00:00:00Z", LeaseSeconds: 300, GraceSeconds: 5}
	if err := Write(d, rec, true); err != nil {
		t.Fatal(err)
	}
	got, err := Read(d)
	if err != nil || got.State != Running || got.Command[2] != "a && b" || got.Schema != 1 {
		t.Fatalf("Read: %+v %v", got, err)
	}
	b, _ := os.ReadFile(filepath.Join(d.Path, "status.json"))
	if strings.Contains(string(b), `\u0026`) {
		t.Error("HTML escaping in the record")
	}
	rec.State = Finished
	rec.SetExit(0)
	rec.Survivors = []int{}
	Write(d, rec, true)
	b, _ = os.ReadFile(filepath.Join(d.Path, "status.json"))
	if !strings.Contains(string(b), `"exit_code": 0`) || !strings.Contains(string(b), `"survivors": []`) {
		t.Fatalf("terminal record must carry exit_code 0 and an empty survivors list:\n%s", b)
	}
}

func TestParseRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"torn":           `{"schema":1,"run_id":"a","sta`,
		"schema":         `{"schema":2,"run_id":"a","state":"running"}`,
		"no schema":      `{"run_id":"a","state":"running"}`,
		"bad id":         `{"schema":1,"run_id":"../a","state":"running"}`,
		"bad state":      `{"schema":1,"run_id":"a","state":"done"}`,
		"terminal no ec": `{"schema":1,"run_id":"a","state":"finished"}`,
		"negative pid":   `{"schema":1,"run_id":"a","state":"running","pid":-5}`,
		"not object":     `[1,2]`,
	} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: accepted %q", name, in)
		}
	}
	if _, err := Parse([]byte(`{"schema":1,"run_id":"a","state":"cancelled","exit_code":143}`)); err != nil {
		t.Errorf("valid record rejected: %v", err)
	}
}

func TestCauseExitCode(t *testing.T) {
	for c, want := range map[string]int{CauseTERM: 143, CauseINT: 130, CauseHUP: 129, CauseCancel: 143, CauseLease: 124} {
		if got := CauseExitCode(c); got != want {
			t.Errorf("%s: %d, want %d", c, got, want)
		}
	}
}
