// Package wrapper supervises one run: it claims the run ID, starts the job
// in its own session, records everything needed to find, stop and judge it,
// streams its output while the caller's stream lives, enforces the lease,
// and stops the whole process tree on a signal, a cancel or lease expiry.
//
// The order of a run, which is the point of this package:
//
//  1. become a child subreaper and subscribe to TERM, INT, HUP, CHLD and PIPE
//     before the job exists, so no exit and no orphan is missed and a closed
//     stream is an error instead of a fatal SIGPIPE;
//  2. claim the ID (mkdir), write `starting` and journal `created`;
//  3. start the job with Setsid, its fds 1 and 2 the log files themselves,
//     AGENT_WRAP_RUN_ID and AGENT_WRAP_CONTROL (a control socket that
//     already listens) in its environment and, with a scoped agent, its
//     SSH_AUTH_SOCK a relay that already listens (authority_linux.go);
//  4. verify PGID == SID == PID from /proc (the job is never reaped before
//     this, so the check holds even when it has already exited);
//  5. write pid, pgid, the deadline and `running`;
//  6. wait for the leader's exit (waitid with WNOWAIT: it stays unreaped, so
//     its PGID cannot be recycled while the group is being stopped), a signal
//     or the deadline;
//  7. journal and sync the intent, write `cancelling`, revoke the run's
//     authority (the relay's socket and connections), ask the runs the job
//     handed on to other hosts to cancel and wait for them up to the
//     handoff grace (handoff_linux.go), then TERM the group
//     and escaped descendants, wait for them to die (SIGCHLD as their
//     subreaper, with a backstop rescan), KILL what is left after the grace;
//  8. reap everything, write the final record, drain the log streams.
//
// Exactly one component waits on the process's children: the reaper
// (reap_linux.go), from the supervisor's goroutine. It reaps by PID, and
// decodes the leader's status once, the first time it sees the exit.
package wrapper

import (
	"io"
	"os"
	"time"

	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// Hangup policies for --on-hangup.
const (
	HangupCancel = "cancel"
	HangupIgnore = "ignore"
)

// Cgroup policies for Config.Cgroup.
const (
	CgroupAuto = "auto"
	CgroupOff  = "off"
)

// Config is one run to supervise.
type Config struct {
	Root *rundir.Root
	ID   string
	Argv []string

	Lease    time.Duration // 0: no lease
	Grace    time.Duration // between TERM and KILL
	Stream   bool          // copy the logs to Stdout/Stderr while they can be written
	OnHangup string        // HangupCancel or HangupIgnore
	// Cgroup is CgroupAuto (the run gets its own cgroup v2 where the host
	// lets us create one) or CgroupOff.
	Cgroup string
	// Agent is AgentScoped, AgentInherit, AgentNone, or "" (scoped). With
	// no SSH_AUTH_SOCK in the process's environment every mode is none.
	Agent string
	// HTTP are the run's credential gateways, their secrets loaded
	// (http_linux.go): each listens before the job starts and is revoked
	// with the agent relay.
	HTTP []*httpgw.Spec
	// HandoffGrace is how long the stop waits for the runs a job handed on
	// to other hosts (`agent-wrap ssh` inside the run) to confirm their
	// cancel before the group is signalled; 0: Grace; negative: no wait.
	HandoffGrace time.Duration

	// Stdin becomes the job's fd 0; nil means /dev/null.
	Stdin *os.File
	// StdinPipe makes the job's fd 0 a pipe that the wrapper feeds with
	// what feeders send over the control socket, counted byte for byte
	// (stdin_linux.go); Stdin is then not used.
	StdinPipe bool
	// Stdout and Stderr receive the streamed logs.
	Stdout, Stderr io.Writer
	// Diag receives the wrapper's own diagnostics (what it could not write).
	Diag io.Writer

	// Running, if set, is called once with the record as soon as the run is
	// `running` (used by --detach to release its caller).
	Running func(*statusfile.Record)

	// Exiting says the process exits as soon as Run returns (the command
	// line does): Run then leaves its signal subscriptions in place instead
	// of undoing them with signal.Stop, which waits for a round trip to the
	// Go runtime's signal-mask thread for each of the five signals, between
	// the final record and the exit of every run. A signal that
	// arrives after the return is then ignored, not fatal: the run is over,
	// and the exit code stays its own.
	Exiting bool
}

// Result is how a run ended.
type Result struct {
	Record *statusfile.Record
	// Code is the exit code `run` returns: the record's exit_code.
	Code int
}
