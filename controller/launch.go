package controller

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"

	"github.com/agent-wrap/agent-wrap/controller/transport"
	"github.com/agent-wrap/agent-wrap/exitcode"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// launch runs `run --detach ... 2>&1 && exec attach` on one connection.
// The detach's words (its record last) come first on stdout; what comes
// after the record is the job's. It returns the record when one arrived,
// and what came before it (messages) as said.
func (r *Run) launch(ctx context.Context) (transport.Result, *launchRecord, string) {
	lease := "0"
	if r.cfg.Lease > 0 {
		lease = r.cfg.Lease.String()
	}
	if l := r.nestedLaunchLease(); l != "" {
		lease = l
	}
	words := append(append([]string{"run", "--detach", "--lease", lease, "--grace", r.cfg.Grace.String()}, r.agentFlags()...), r.gw.args...)
	words = append(words, r.stdinWords()...)
	words = append(append(words, r.cfg.ID, "--"), r.argv...)
	// --from before the ID: an agent-wrap too old to know attach reads
	// this as the short form of run with an unknown flag, a usage error
	// (64) found before any claim, rather than run a job named RUN_ID.
	snd, stdinFrom := r.stdinSender() // stdin.go: the job's stdin follows the gateways' secrets
	if snd != nil {
		defer snd.stop()
	}
	attachWords := append(append([]string{"attach", "--from", "0,0"}, stdinFrom...), r.cfg.ID)
	line := r.h.Remote(words...) + " 2>&1 && exec " + r.h.Remote(attachWords...)

	ctx, cancel := r.withGiveUp(ctx)
	defer cancel()
	lh := r.launchHost()
	stdin, forget := r.gw.stdin() // the gateways' secrets, sent again on each try
	defer forget()
	var gate *launchGate // launchgate.go
	if lh.Muxed() {
		g, err := newLaunchGate(ctx)
		if err != nil {
			return transport.Result{Code: exitcode.Lost, Err: err, NoLog: true}, nil, ""
		}
		gate, line = g, g.wrap(line)
		// Through a master: the gate's pipe carries "go", then the
		// secrets, then the job's stdin. Set before the ready line can
		// be read.
		gate.payload = stdin
		if snd != nil {
			gate.then = snd.run
		}
	}
	pr, pw := io.Pipe()
	var rec *launchRecord
	var said bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		rec = r.splitLaunch(pr, &said, gate)
		io.Copy(io.Discard, pr)
	}()
	errw := r.newLaunchStderr()
	var res transport.Result
	switch {
	case gate != nil:
		res = lh.Call(ctx, transport.Call{Line: line, Stdin: gate.r, Stdout: pw, Stderr: errw, Long: true})
		if snd != nil {
			snd.stop()
		}
		gate.close()
	case snd != nil:
		in, done, err := snd.pipe(stdin)
		if err != nil {
			res = transport.Result{Code: exitcode.Lost, Err: err}
			break
		}
		res = lh.Call(ctx, transport.Call{Line: line, Stdin: in, Stdout: pw, Stderr: errw})
		snd.stop()
		done()
	default:
		res = lh.Call(ctx, transport.Call{Line: line, Input: stdin, Stdout: pw, Stderr: errw})
	}
	pw.Close()
	<-done
	res.Early = errw.end()
	if said.Len() > 0 {
		// What the host said before (or instead of) a record: agent-wrap's
		// messages, or the shell's (command not found). Not the job's, so
		// not counted in its stderr.
		r.cfg.Stderr.Write(said.Bytes())
	}
	return res, rec, said.String()
}

// launchRecord is what the controller reads of the run --detach record.
type launchRecord struct {
	RunID  string `json:"run_id"`
	State  string `json:"state"`
	PID    int    `json:"pid"`
	PGID   int    `json:"pgid"`
	BootID string `json:"boot_id"`
}

// splitLaunch reads the launch connection's stdout: lines before the
// record's opening "{" line go to said, the record is decoded, and
// everything after it is copied to the job's stdout (counted). It returns
// nil when no record came.
func (r *Run) splitLaunch(in io.Reader, said *bytes.Buffer, gate *launchGate) *launchRecord {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if gate != nil && line == gateReady+"\n" {
			gate.ready()
			continue
		}
		if line == "{\n" {
			var rec launchRecord
			dec := json.NewDecoder(io.MultiReader(strings.NewReader(line), br))
			if err := dec.Decode(&rec); err != nil || rec.RunID != r.cfg.ID {
				said.WriteString(line)
				return nil
			}
			rest := io.MultiReader(dec.Buffered(), br)
			var nl [1]byte
			if n, _ := io.ReadFull(rest, nl[:]); n == 1 && nl[0] != '\n' {
				r.out.Write(nl[:])
			}
			r.running(&rec)
			io.Copy(r.out, rest)
			return &rec
		}
		said.WriteString(line)
		if err != nil {
			return nil
		}
	}
}

// running records the run's start on the host (its record, or a verdict
// that the host has it), then wakes what waits for the launch. Once: a
// second start is refused by the run's state.
func (r *Run) running(rec *launchRecord) {
	if _, ok := r.move(onLaunched, func(l *ledger.Record, _ runState) {
		l.RemotePID, l.RemotePGID, l.BootID = rec.PID, rec.PGID, rec.BootID
		l.Reason = ""
	}); !ok {
		return
	}
	r.lostSaid.Store(false)
	r.ev.emit(EvRunning, map[string]any{"remote_pid": rec.PID, "boot_id": rec.BootID})
	close(r.launched)
	r.gw.forget()
}
