package reconcile

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/statusfile"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func record(state, cause string, code int) *statusfile.Record {
	r := &statusfile.Record{Schema: 1, RunID: "r1", State: state, Cause: cause,
		PID: 500, PGID: 500, SID: 500, WrapperPID: 400, BootID: "boot-a"}
	if statusfile.Terminal(state) {
		r.SetExit(code)
	}
	return r
}

// unrecorded is a live record whose wrapper never recorded the job: no
// process group.
func unrecorded(state, cause string) *statusfile.Record {
	r := record(state, cause, 0)
	r.PID, r.PGID, r.SID = 0, 0, 0
	return r
}

var (
	sleeper = Member{PID: 501, PGID: 500, SID: 500, State: "S", Comm: "sleep"}
	leader  = Member{PID: 500, PGID: 500, SID: 500, State: "S", Comm: "sh"}
)

// TestDecide has one case per row of the contract's reconcile table, and one
// per choice made where the table is silent (README.md).
func TestDecide(t *testing.T) {
	launchFailed := record(statusfile.LaunchFailed, "", 127)
	launchFailed.Error = "command not found: nosuch"
	killedLeader := record(statusfile.Finished, "", 137)
	killedLeader.Signal = "KILL"
	withContainment := func(r *statusfile.Record, c string) *statusfile.Record {
		r.Containment = c
		return r
	}

	tests := []struct {
		name       string
		in         Input
		outcome    string
		code       int // -1: exit_code must be null
		supervisor string
		reason     []string // substrings the reason must contain
	}{
		// state finished: completed, with exit_code.
		{"finished", Input{Record: record(statusfile.Finished, "", 3)},
			Completed, 3, SupervisorNone, []string{"finished with exit code 3"}},
		{"finished/wrapper-still-draining", Input{Record: record(statusfile.Finished, "", 0), WrapperAlive: true},
			Completed, 0, SupervisorAlive, []string{"exit code 0"}},
		{"finished/leader-signalled", Input{Record: killedLeader},
			Completed, 137, SupervisorNone, []string{"SIGKILL"}},
		{"finished/stragglers-noted", Input{Record: record(statusfile.Finished, "", 0), Members: []Member{sleeper}},
			Completed, 0, SupervisorNone, []string{"still alive", "PID 501 (sleep)"}},
		{"finished/boot-changed", Input{Record: record(statusfile.Finished, "", 1), BootChanged: true},
			Completed, 1, SupervisorNone, nil},
		// launch_failed is terminal too: the command never ran.
		{"launch-failed", Input{Record: launchFailed},
			Completed, 127, SupervisorNone, []string{"launch failed", "command not found"}},

		// A stop that had no proof beyond the session (from outside the
		// wrapper, without a cgroup) cannot confirm the cleanup, even
		// with nothing of the session alive; cgroup and subreaper can.
		{"cancelled/containment-session", Input{Record: withContainment(record(statusfile.Cancelled, statusfile.CauseLease, 124), statusfile.ContainmentSession)},
			Unknown, -1, SupervisorNone, []string{"cannot be confirmed", "containment session", "left its session unrecorded"}},
		{"cancelled/containment-cgroup", Input{Record: withContainment(record(statusfile.Cancelled, statusfile.CauseLease, 124), statusfile.ContainmentCgroup)},
			Cancelled, 124, SupervisorNone, []string{"no process of the run is alive"}},
		{"cancelled/containment-subreaper", Input{Record: withContainment(record(statusfile.Cancelled, statusfile.CauseCancel, 143), statusfile.ContainmentSubreaper)},
			Cancelled, 143, SupervisorNone, nil},
		{"finished/containment-session", Input{Record: withContainment(record(statusfile.Finished, "", 0), statusfile.ContainmentSession)},
			Completed, 0, SupervisorNone, []string{"cannot be known"}},

		// state cancelled and no validated member alive: cancelled.
		{"cancelled", Input{Record: record(statusfile.Cancelled, statusfile.CauseCancel, 143)},
			Cancelled, 143, SupervisorNone, []string{"cause cancel", "no process of the run is alive"}},
		{"cancelled/lease", Input{Record: record(statusfile.Cancelled, statusfile.CauseLease, 124)},
			Cancelled, 124, SupervisorNone, []string{"cause lease"}},
		// state cancelled but members alive: unknown, PIDs listed.
		{"cancelled/member-alive", Input{Record: record(statusfile.Cancelled, statusfile.CauseTERM, 143), Members: []Member{sleeper}},
			Unknown, -1, SupervisorNone, []string{"cleanup is not confirmed", "PID 501 (sleep) is still alive"}},
		{"cancelled/members-alive", Input{Record: record(statusfile.Cancelled, statusfile.CauseTERM, 143), Members: []Member{leader, sleeper}},
			Unknown, -1, SupervisorNone, []string{"PIDs 500, 501 (sh, sleep) are still alive"}},
		{"cancelled/escaped-alive", Input{Record: record(statusfile.Cancelled, statusfile.CauseTERM, 143), Members: []Member{{PID: 900, PGID: 900, SID: 900, Comm: "daemon", Escaped: true}}},
			Unknown, -1, SupervisorNone, []string{"PID 900 (escaped) (daemon)"}},
		{"cancelled/members-unverifiable", Input{Record: record(statusfile.Cancelled, statusfile.CauseTERM, 143), MembersErr: errors.New("cannot read the process table")},
			Unknown, -1, SupervisorNone, []string{"cannot be confirmed", "process table"}},
		{"cancelled/boot-changed", Input{Record: record(statusfile.Cancelled, statusfile.CauseCancel, 143), BootChanged: true},
			Cancelled, 143, SupervisorNone, []string{"rebooted"}},

		// not terminal, wrapper alive: running.
		{"running/wrapper-alive", Input{Record: record(statusfile.Running, "", 0), WrapperAlive: true, Members: []Member{leader}},
			Running, -1, SupervisorAlive, []string{"wrapper (PID 400) is alive"}},
		{"starting/wrapper-alive", Input{Record: record(statusfile.Starting, "", 0), WrapperAlive: true},
			Running, -1, SupervisorAlive, []string{"the run is starting"}},
		{"cancelling/wrapper-alive", Input{Record: record(statusfile.Cancelling, statusfile.CauseTERM, 0), WrapperAlive: true, Members: []Member{leader}},
			Running, -1, SupervisorAlive, []string{"cancelling (cause signal:TERM)", "stopping it"}},
		{"running/wrapper-alive/lease-passed", Input{Record: record(statusfile.Running, "", 0), WrapperAlive: true, Deadline: now.Unix() - 10, Now: now},
			Running, -1, SupervisorAlive, []string{"lease expired 10s ago"}},

		// not terminal, wrapper dead, group members alive: running, supervisor lost.
		{"running/wrapper-dead/members", Input{Record: record(statusfile.Running, "", 0), Members: []Member{leader, sleeper}},
			Running, -1, SupervisorLost, []string{"supervisor lost", "PIDs 500, 501", "running, not cancelling"}},
		{"cancelling/wrapper-dead/members", Input{Record: record(statusfile.Cancelling, statusfile.CauseTERM, 0), Members: []Member{leader}},
			Running, -1, SupervisorLost, []string{"supervisor lost", "cancelling (cause signal:TERM)"}},

		// not terminal, wrapper dead, group empty: unknown, saying whether it was cancelling.
		{"running/wrapper-dead/empty", Input{Record: record(statusfile.Running, "", 0)},
			Unknown, -1, SupervisorLost, []string{"supervisor died before a final record", "running, not cancelling"}},
		{"cancelling/wrapper-dead/empty", Input{Record: record(statusfile.Cancelling, statusfile.CauseLease, 0)},
			Unknown, -1, SupervisorLost, []string{"supervisor died before a final record", "cancelling (cause lease)"}},
		{"starting/wrapper-dead", Input{Record: unrecorded(statusfile.Starting, "")},
			Unknown, -1, SupervisorLost, []string{"supervisor died before a final record", "started unseen"}},
		{"cancelling-while-starting/wrapper-dead", Input{Record: unrecorded(statusfile.Cancelling, statusfile.CauseCancel)},
			Unknown, -1, SupervisorLost, []string{"supervisor died before a final record", "cancelling (cause cancel)", "started unseen"}},
		{"running/wrapper-dead/empty/lock-busy", Input{Record: record(statusfile.Running, "", 0), LockBusy: true},
			Unknown, -1, SupervisorLost, []string{"holds the run's lock"}},
		{"running/wrapper-dead/unverifiable", Input{Record: record(statusfile.Running, "", 0), MembersErr: errors.New("record is inconsistent")},
			Unknown, -1, SupervisorLost, []string{"cannot be checked", "inconsistent"}},

		// boot_id differs and not terminal: unknown, host rebooted, whatever else is seen.
		{"running/boot-changed", Input{Record: record(statusfile.Running, "", 0), BootChanged: true},
			Unknown, -1, SupervisorLost, []string{"host rebooted", "boot-a"}},
		{"cancelling/boot-changed", Input{Record: record(statusfile.Cancelling, statusfile.CauseCancel, 0), BootChanged: true, Members: []Member{leader}},
			Unknown, -1, SupervisorLost, []string{"host rebooted", "cancelling (cause cancel)"}},

		// status.json missing or unreadable: unknown, with the parse error.
		{"record-unreadable", Input{RecordErr: errors.New("status.json does not parse: unexpected end of JSON input")},
			Unknown, -1, SupervisorNone, []string{"cannot be read", "does not parse"}},
		{"record-missing", Input{RecordErr: errors.New("status.json is missing")},
			Unknown, -1, SupervisorNone, []string{"missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.RunID = "r1"
			if tt.in.Now.IsZero() {
				tt.in.Now = now
			}
			v := Decide(tt.in)
			if v.Outcome != tt.outcome {
				t.Errorf("outcome %s, want %s (reason: %s)", v.Outcome, tt.outcome, v.Reason)
			}
			switch {
			case tt.code < 0 && v.ExitCode != nil:
				t.Errorf("exit_code %d, want null", *v.ExitCode)
			case tt.code >= 0 && (v.ExitCode == nil || *v.ExitCode != tt.code):
				t.Errorf("exit_code %v, want %d", v.ExitCode, tt.code)
			}
			if v.Supervisor != tt.supervisor {
				t.Errorf("supervisor %s, want %s", v.Supervisor, tt.supervisor)
			}
			for _, s := range tt.reason {
				if !strings.Contains(v.Reason, s) {
					t.Errorf("reason %q lacks %q", v.Reason, s)
				}
			}
			if v.RunID != "r1" || v.Evidence.Members == nil {
				t.Errorf("run_id %q, members %v: want r1 and a list", v.RunID, v.Evidence.Members)
			}
			if tt.in.Record != nil && v.Evidence.State != tt.in.Record.State {
				t.Errorf("evidence state %q, want %q", v.Evidence.State, tt.in.Record.State)
			}
		})
	}
}

func TestEvidenceDeadline(t *testing.T) {
	v := Decide(Input{RunID: "r1", Record: record(statusfile.Running, "", 0), WrapperAlive: true, Deadline: now.Unix() + 60, Now: now})
	if v.Evidence.Deadline == nil || *v.Evidence.Deadline != now.Unix()+60 || v.Evidence.DeadlinePassed {
		t.Errorf("deadline %v passed %v", v.Evidence.Deadline, v.Evidence.DeadlinePassed)
	}
	v = Decide(Input{RunID: "r1", Record: record(statusfile.Running, "", 0), WrapperAlive: true, Now: now})
	if v.Evidence.Deadline != nil {
		t.Errorf("no lease: deadline %v, want null", *v.Evidence.Deadline)
	}
	v = Decide(Input{RunID: "r1", Record: record(statusfile.Running, "", 0), Deadline: now.Unix(), Now: now})
	if !v.Evidence.DeadlinePassed {
		t.Errorf("deadline == now must count as passed")
	}
}

func TestWorst(t *testing.T) {
	for _, tt := range []struct{ a, b, want int }{
		{0, 0, 0}, {0, 3, 3}, {3, 0, 3}, {3, 4, 4}, {4, 3, 4}, {0, 4, 4}, {4, 0, 4},
	} {
		if got := Worst(tt.a, tt.b); got != tt.want {
			t.Errorf("Worst(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
	for outcome, want := range map[string]int{Completed: 0, Cancelled: 0, Running: 3, Unknown: 4, "": 4} {
		if got := OutcomeExit(outcome); got != want {
			t.Errorf("OutcomeExit(%q) = %d, want %d", outcome, got, want)
		}
	}
}
