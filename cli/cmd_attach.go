//go:build linux

package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/agent-wrap/agent-wrap/handoff"
	"github.com/agent-wrap/agent-wrap/rundir"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

func init() {
	register(&command{
		name:     "attach",
		summary:  "stream both logs from byte offsets, following them until the run is over",
		synopsis: "attach [--from N,M] [--stdin-from K] RUN_ID",
		help:     attachHelp,
		exits:    "as wait: the run's exit code; 75 the outcome is unknown; 66 no such run; 64 usage; 78 unsafe run root",
		run:      runAttach,
	})
}

const attachHelp = `attach writes the job's stdout.log from byte N to stdout and its stderr.log
from byte M to stderr, byte for byte, follows both until the run is terminal,
and exits as wait would: the run's exit code (75 when the outcome is
unknown). A controller that counted the bytes it received of each stream
reattaches with --from N,M after a lost connection and gets every byte once.

With --stdin-from K, attach also feeds the job's stdin (a run started with
run --stdin pipe): what it reads on its own stdin, the stream's frames from
byte K on, goes to the run's wrapper, which skips what the job already has.
A K past the bytes the job was given would leave a hole in its stdin: the
run is cancelled with cause stdin_lost instead.
`

func runAttach(e *Env, args []string) int {
	fs := e.flags("attach")
	from := fs.String("from", "0,0", "start at byte `N,M` of stdout.log and stderr.log")
	stdinFrom := fs.Int64("stdin-from", -1, "feed the job's stdin from this command's stdin, whose first byte is byte `K` of the stream (run --stdin pipe); default: not fed")
	fs.Lookup("stdin-from").DefValue = ""
	fs.SetInterspersed(true) // no job argv here: flags may follow RUN_ID
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("attach takes one RUN_ID")
	}
	if fs.Changed("stdin-from") && *stdinFrom < 0 {
		return e.usageError("attach: --stdin-from %d: want a non-negative byte offset", *stdinFrom)
	}
	n, m, err := parseOffsets(*from)
	if err != nil {
		return e.usageError("attach: --from %q: %v", *from, err)
	}
	root, d, code := e.openRun(fs.Arg(0))
	if d == nil {
		return code
	}
	defer root.Close()
	defer d.Close()

	if *stdinFrom >= 0 {
		go feedStdin(e, d, *stdinFrom)
	}
	out := &logReader{e: e, d: d, name: rundir.StdoutFile, w: e.Stdout, from: n}
	defer out.close()
	errl := &logReader{e: e, d: d, name: rundir.StderrFile, w: e.Stderr, from: m}
	defer errl.close()
	rec, v, code := followLogs(e, d, out, errl)
	switch {
	case rec != nil:
		return rec.Code()
	case v != nil:
		e.errorf("run %s: outcome unknown: %s", d.ID, v.Reason)
		e.hint("'agent-wrap reconcile %s' shows the evidence, 'agent-wrap cancel %s' records a final state", d.ID, d.ID)
		return ExitTempFail
	}
	return code
}

// parseOffsets reads "N,M": two non-negative decimal byte offsets.
func parseOffsets(s string) (int64, int64, error) {
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return 0, 0, fmt.Errorf("want two byte offsets N,M")
	}
	n, err1 := strconv.ParseInt(a, 10, 64)
	m, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || n < 0 || m < 0 {
		return 0, 0, fmt.Errorf("want two non-negative decimal byte offsets N,M")
	}
	return n, m, nil
}

// feedStdin relays this command's stdin (a controller's frames) to the
// wrapper of run d as the feeder of its stdin from byte from. What cannot
// be delivered (the run does not read a fed stdin, is over, or is being
// cancelled for a gap) is read and dropped, so the sender is never stuck:
// the run's own record says what happened to it. Nothing is said here:
// attach's stdout and stderr are the job's.
func feedStdin(e *Env, d *rundir.Dir, from int64) {
	defer io.Copy(io.Discard, e.Stdin)
	rec, err := statusfile.Read(d)
	if err != nil || rec.ControlSocket == "" {
		return
	}
	conn, reply, err := handoff.DialStdin(rec.ControlSocket, d.ID, from)
	if err != nil || !reply.OK {
		return
	}
	defer conn.Close()
	if reply.Closed != "" {
		return
	}
	_, _ = io.Copy(conn, e.Stdin)
}
