package controller_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agent-wrap/agent-wrap/controller"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// A runner's loop: start (the ledger record is on disk before any
// connection), cancel on a signal, follow to the run's exit code. After a
// crash of the runner, controller.Settle (or `agent-wrap settle --all`)
// finishes every run the ledger holds.
func Example() {
	// A directory, or postgres://runner@db.internal/ledger for a fleet.
	l, err := ledger.OpenForController(context.Background(), "/var/lib/my-runner/ledger")
	if err != nil {
		panic(err)
	}
	run, err := controller.Start(controller.Config{
		Rsh:    []string{"ssh", "-o", "BatchMode=yes"},
		Dest:   "build-host-7",
		Ledger: l,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}, []string{"make", "test"})
	if err != nil {
		panic(err) // nothing was started
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() { <-sigs; run.Cancel() }()
	code := run.Follow(context.Background()) // the run's code, or 255: unknown
	rec := run.Record()                      // the ledger's word: outcome, cause, exit_code
	if rec.State != ledger.Settled {
		// Unknown for now: controller.Settle(ctx, l, run.ID(), controller.SettleOptions{}) asks again later.
		fmt.Fprintf(os.Stderr, "run %s: %s\n", run.ID(), rec.Reason)
	}
	_ = code // exit with it, as ssh would
}

// The job's stdin: bytes the caller holds (an MCP server's `run` tool with
// stdin, say) go in as a reader, read once as they are sent. The job reads
// them, then end of file; a reattach after a lost connection resumes them
// without a byte lost or given twice. Without Stdin the job's stdin is
// /dev/null.
func ExampleConfig_stdin() {
	l, err := ledger.OpenForController(context.Background(), "/var/lib/my-runner/ledger")
	if err != nil {
		panic(err)
	}
	keep, err := controller.StdinKeepFromEnv(os.Getenv) // $AGENT_WRAP_STDIN_KEEP, 0: 64 MiB
	if err != nil {
		panic(err)
	}
	var out bytes.Buffer
	run, err := controller.Start(controller.Config{
		Dest:      "db-1",
		Ledger:    l,
		Stdin:     strings.NewReader("select 1;\n"),
		StdinKeep: keep,
		Stdout:    &out,
		Stderr:    os.Stderr,
	}, []string{"psql", "-X"})
	if err != nil {
		panic(err)
	}
	code := run.Follow(context.Background())
	fmt.Println(code, out.String())
}
