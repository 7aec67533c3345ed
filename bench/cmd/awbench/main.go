// Command awbench measures agent-wrap against what a job costs without it,
// each figure against a baseline interleaved in the same run, and writes
// BENCHMARKS.md. `make bench` runs it; BENCH_QUICK=1 (or -quick) takes fewer
// samples and smaller sizes.
//
//	awbench -bin bin/agent-wrap -out BENCHMARKS.md [-quick] [-only startup,cancel,...]
//	awbench readall ROOT    (the watchdog baseline: read every status.json once)
//
// The floor figures also run bin/awfloor (bench/cmd/awfloor), built beside it.
//
// Every process it starts is stopped through its recorded PID or process
// group (a pidfd where it can), never by name.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// figures in the order they run and are reported.
var figures = []string{"costs", "binary", "startup", "cancel", "floor", "output", "memory", "idle", "idlescale", "watchdog", "lease", "controller", "authority", "nested", "http", "ledger", "mcp", "scale", "fanout"}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "readall" {
		return readall(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "signloop" {
		return signloop(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "httploop" {
		return httploop(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("awbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin/agent-wrap", "the agent-wrap binary to measure")
	out := fs.String("out", "BENCHMARKS.md", "the report to write (- for stdout)")
	quick := fs.Bool("quick", os.Getenv("BENCH_QUICK") != "", "fewer samples, smaller sizes (default from $BENCH_QUICK)")
	only := fs.String("only", "", "comma-separated figures to run: "+strings.Join(figures, ","))
	command := fs.String("command", "", "the command line to print in the report (default: this one)")
	keep := fs.Bool("keep", false, "keep the scratch run root")
	compare := fs.String("compare", "", "another agent-wrap binary (a proposed fix) to sample alongside in the startup, cancel and lease figures")
	if err := fs.Parse(args); err != nil {
		return 64
	}
	sel := map[string]bool{}
	for _, f := range strings.Split(*only, ",") {
		if f = strings.TrimSpace(f); f != "" {
			sel[f] = true
		}
	}
	for f := range sel {
		if !contains(figures, f) {
			fmt.Fprintf(stderr, "awbench: unknown figure %q (have %s)\n", f, strings.Join(figures, ","))
			return 64
		}
	}
	if *command == "" {
		*command = "awbench " + strings.Join(args, " ")
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintf(stderr, "awbench: %v\n", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "awbench: %v\n", err)
		return 1
	}
	scratch, err := os.MkdirTemp("", "awbench-")
	if err != nil {
		fmt.Fprintf(stderr, "awbench: %v\n", err)
		return 1
	}
	r := &runner{bin: absBin, self: self, scratch: scratch, quick: *quick, log: stderr}
	if *compare != "" {
		if r.alt, err = filepath.Abs(*compare); err != nil {
			fmt.Fprintf(stderr, "awbench: %v\n", err)
			return 1
		}
	}
	defer func() {
		r.cleanupAll()
		if *keep {
			fmt.Fprintf(stderr, "awbench: kept %s\n", scratch)
		} else {
			os.RemoveAll(scratch)
		}
	}()
	help, _ := exec.Command(absBin, "help").CombinedOutput()
	r.has = func(cmd string) bool { return strings.Contains(string(help), "\n  "+cmd+" ") }

	started := time.Now()
	r.machine = machineInfo(absBin, scratch)
	r.loadBefore = loadavg()
	failed := false
	for _, f := range figures {
		if len(sel) > 0 && !sel[f] {
			continue
		}
		r.logf("== %s", f)
		t0 := time.Now()
		if err := r.figure(f); err != nil {
			failed = true
			r.logf("%s: %v", f, err)
			r.rows = append(r.rows, row{figure: f, measured: "error: " + oneLine(err), pass: "error"})
		}
		r.cleanupAll()
		r.logf("   %s took %.1fs", f, time.Since(t0).Seconds())
	}
	r.loadAfter = loadavg()
	r.elapsed = time.Since(started)

	text := r.report(*command, started)
	if *out == "-" {
		io.WriteString(stdout, text)
	} else if err := writeAtomic(*out, []byte(text)); err != nil {
		fmt.Fprintf(stderr, "awbench: %v\n", err)
		return 1
	} else {
		r.logf("wrote %s", *out)
	}
	io.WriteString(stderr, r.table())
	if failed {
		return 1
	}
	return 0
}

func (r *runner) figure(name string) error {
	switch name {
	case "costs":
		return r.costs()
	case "binary":
		return r.binary()
	case "startup":
		return r.startup()
	case "cancel":
		return r.cancel()
	case "floor":
		return r.floor()
	case "output":
		return r.output()
	case "memory":
		return r.memory()
	case "watchdog":
		return r.watchdog()
	case "lease":
		return r.lease()
	case "controller":
		return r.controllerFigure()
	case "authority":
		return r.authority()
	case "nested":
		return r.nestedFigure()
	case "http":
		return r.httpFigure()
	case "ledger":
		return r.ledgerFigure()
	case "mcp":
		return r.mcpFigure()
	case "scale":
		return r.scale()
	case "fanout":
		return r.fanoutFigure()
	case "idle":
		return r.idle()
	case "idlescale":
		return r.idleScale()
	}
	return fmt.Errorf("unknown figure %q", name)
}

// readall is the baseline of the watchdog scan, as a process of its own so
// that both sides pay for a process start.
func readall(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: awbench readall ROOT")
		return 64
	}
	n, err := bench.ReadAllStatus(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "awbench: readall: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, n)
	return 0
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

func writeAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".bench-*.md")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
