//go:build linux

package cli

import (
	"encoding/json"
	"os"
	"time"
	"unicode/utf8"

	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func init() {
	register(&command{
		name:     "authorize",
		summary:  "ask, for a gateway, whether a process of a live run may act now",
		synopsis: "authorize [--pid PID] [--channel NAME] [--target TEXT]",
		help:     authorizeHelp,
		exits:    "0 accepted; 1 refused; 66 the process belongs to no run (nothing journaled); 64 usage; 78 unsafe run root",
		run:      runAuthorize,
	})
}

const authorizeHelp = `authorize is the question a gateway (a credential helper, a token broker, a
proxy) asks before it acts for a process: does the process belong to a run
that is running, with no cancel or expiry recorded and its lease not passed?
It finds the run that holds the process, decides under the run's lock,
journals the answer in the run as an "action" event (synced when accepted)
and prints one JSON line: run_id, decision, reason, deadline_epoch, seq.`

// Limits on what a gateway may write into a run's journal.
const (
	maxChannel = 64
	maxTarget  = 1024
)

// runAuthorize is the question any gateway on the host (a credential
// helper, a token broker, a proxy) asks before it acts for a process: is
// that process part of a live run that may act now? The answer is
// journaled in that run and printed as one JSON line. Exit 0 accepted, 1
// refused, 66 the process belongs to no run (nothing journaled).
func runAuthorize(e *Env, args []string) int {
	fs := e.flags("authorize")
	pid := fs.Int("pid", 0, "the process that wants to act (default: the caller's parent)")
	channel := fs.String("channel", "authorize", "the gateway's `NAME`, journaled as the action's channel")
	target := fs.String("target", "", "what the action is for (a host, a URL), journaled as is: never a secret")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return e.usageError("authorize takes no arguments, only flags")
	}
	if !validChannel(*channel) {
		return e.usageError("--channel must be 1 to %d letters, digits, '.', '_' or '-', not %q", maxChannel, *channel)
	}
	if len(*target) > maxTarget || !utf8.ValidString(*target) {
		return e.usageError("--target must be UTF-8 text of at most %d bytes", maxTarget)
	}
	p := *pid
	if p == 0 {
		p = os.Getppid()
	}
	if p <= 0 {
		return e.usageError("--pid must be a process ID, not %d", p)
	}
	out := json.NewEncoder(e.Stdout)
	noRun := func(why string) int {
		_ = out.Encode(authority.Decision{Decision: authority.Refused, Reason: why})
		e.errorf("process %d belongs to no run: %s", p, why)
		return ExitNoRun
	}
	st, err := proc.ReadStat(p)
	if err != nil || st.Dead() {
		return noRun("no_such_process")
	}
	root, code := e.openRoot(false)
	if root == nil {
		if code == ExitNoRun {
			return noRun("no_run")
		}
		return code
	}
	defer root.Close()
	// One open of the run directory and one read of its record: Find
	// hands back the run it found, locked, with the record it judged the
	// caller by, and the decision is made under that lock, on that record.
	run, err := membership.Find(root, p, st.Start)
	if err != nil {
		return noRun("no_run")
	}
	defer run.Close()
	readErr := waitStarted(run)
	gate := authority.Gate{Dir: run.Dir, Member: run.Holds}
	dec, err := gate.DecideHeld(authority.Action{Channel: *channel, Target: *target, CallerPID: p, CallerStart: st.Start}, run.Record, readErr)
	_ = out.Encode(dec)
	if err != nil {
		e.errorf("%v", err)
	}
	if !dec.Allowed() {
		return ExitFailure
	}
	return ExitOK
}

func validChannel(s string) bool {
	if s == "" || len(s) > maxChannel {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// waitStarted waits while the run is still being started: a job may ask in
// its first milliseconds, before the wrapper has recorded it running, and
// that is not a refusal. Each look releases the run's lock, sleeps, and
// takes it again with a fresh read (membership.Found.Relock); a run past
// starting costs no look at all. It gives up after startWait, and returns
// the last read's error; the decision is then made from the record as it
// is, under the lock it leaves held.
func waitStarted(run *membership.Found) error {
	const startWait = 10 * time.Second
	deadline := time.Now().Add(startWait)
	var err error
	for pause := time.Millisecond; run.Record != nil && run.Record.State == statusfile.Starting && time.Now().Before(deadline); pause = min(2*pause, 50*time.Millisecond) {
		run.Unlock()
		time.Sleep(pause)
		if err = run.Relock(); err != nil {
			return err
		}
	}
	return err
}
