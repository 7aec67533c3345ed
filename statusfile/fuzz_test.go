package statusfile_test

import (
	"reflect"
	"testing"

	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// FuzzStatusParse feeds Parse arbitrary bytes (seeded with real records from
// runs in every state, torn prefixes of them and foreign JSON, under
// testdata/fuzz/FuzzStatusParse). Parse must never panic, and whatever it
// accepts must be a complete schema-1 record that survives a Marshal and
// Parse round trip unchanged: a half-written or foreign file is an error,
// never a record.
func FuzzStatusParse(f *testing.F) {
	f.Add([]byte(`{"schema":1,"run_id":"a","state":"running","wrapper_pid":1,"wrapper_start":2,"boot_id":"b","command":["sleep","1"],"created_at":"2026-01-01T00:00:00Z","lease_seconds":300,"grace_seconds":5,"survivors":null}`))
	f.Add([]byte(`{"schema":1,"run_id":"a","state":"finished","exit_code":0,"wrapper_pid":1,"survivors":[]}`))
	f.Add([]byte(`{"schema":1,"run_id":"a","state":"finished","wrapper_pid":1}`))
	f.Add([]byte(`{"schema":1,"run_id":"a","state":"cancelled","exit_code":143,"wrapper_pid":1,"survivors":[],"handoffs":[]}`))
	f.Add([]byte(`{"schema":1,"run_id":"a","state":"running","wrapper_pid":1,"control_socket":"/r/a/control.sock","handoffs":[{"run_id":"b","dest":"h","controller_pid":3,"controller_start":4,"registered_at":"2026-01-01T00:00:00Z","outcome":"unknown","exit_code":143,"learned":"unconfirmed","lease_ends_at":"2026-01-01T00:05:00Z","remaining":"run b on h"}]}`))
	f.Add([]byte(`{"schema":2,"run_id":"a","state":"running"}`))
	f.Add([]byte(`{"schema":1,"run_id":"../x","state":"running"}`))
	f.Add([]byte(`{"schema":1,"run_id":"a","state":"running","pid":-1}`))
	f.Add([]byte(`{"schema":1,"run_id":"a","sta`))
	f.Add([]byte(``))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := statusfile.Parse(b)
		if err != nil {
			if r != nil {
				t.Fatalf("Parse returned a record and an error: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("Parse returned an empty error")
			}
			return
		}
		if r == nil {
			t.Fatal("Parse returned neither a record nor an error")
		}
		checkRecord(t, r)
		out, err := statusfile.Marshal(r)
		if err != nil {
			t.Fatalf("Marshal of an accepted record: %v", err)
		}
		r2, err := statusfile.Parse(out)
		if err != nil {
			t.Fatalf("an accepted record does not parse after Marshal: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", r, r2)
		}
	})
}

func checkRecord(t *testing.T, r *statusfile.Record) {
	t.Helper()
	if r.Schema != statusfile.Schema {
		t.Fatalf("accepted schema %d", r.Schema)
	}
	if err := rundir.ValidID(r.RunID); err != nil {
		t.Fatalf("accepted run_id %q: %v", r.RunID, err)
	}
	switch r.State {
	case statusfile.Starting, statusfile.Running, statusfile.Cancelling:
	case statusfile.Finished, statusfile.Cancelled, statusfile.LaunchFailed:
		if r.ExitCode == nil {
			t.Fatalf("accepted terminal state %s without exit_code", r.State)
		}
	default:
		t.Fatalf("accepted state %q", r.State)
	}
	if r.PID < 0 || r.PGID < 0 || r.SID < 0 || r.WrapperPID < 0 {
		t.Fatalf("accepted a negative PID: %+v", r)
	}
}
