//go:build linux

package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-wrap/agent-wrap/rundir"
)

func init() {
	register(&command{
		name:     "attach",
		summary:  "stream both logs from byte offsets, following them until the run is over",
		synopsis: "attach [--from N,M] RUN_ID",
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
`

func runAttach(e *Env, args []string) int {
	fs := e.flags("attach")
	from := fs.String("from", "0,0", "start at byte `N,M` of stdout.log and stderr.log")
	fs.SetInterspersed(true) // no job argv here: flags may follow RUN_ID
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("attach takes one RUN_ID")
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
