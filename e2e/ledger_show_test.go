package e2e

import (
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
)

// `ledger show` through a real sshd: the controller's record
// of a run cancelled with SIGINT, then the host's timeline of the same run,
// asked for over the run's recorded rsh: the intent by the cancel, the
// signal, the final record, the chain verified.
func TestLedgerShowOverSSH(t *testing.T) {
	t.Parallel()
	c := newCtlHarness(t)
	k := c.start("lshow", longLease, sleepTree...)
	runtest.Eventually(t, "the job's first line", func() bool { return strings.Contains(k.stdout(), "started\n") })
	r := c.waitRunning("lshow")
	waitMembers(t, r.PGID, 3)
	k.signal(t, syscall.SIGINT)
	if code := k.wait(t); code != 143 {
		t.Fatalf("controller exit %d, want 143\nstderr: %s", code, k.stderr())
	}
	c.wantSettled("lshow", "cancelled", "cancel", 143)

	cmd := exec.Command(bin, "ledger", "show", "--ledger", c.ledger, "lshow")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("ledger show: %v\n%s%s", err, out.String(), errb.String())
	}
	for _, re := range []string{
		`^run lshow \(ledger\): settled, cancelled, exit 143$`,
		`^  dest: +` + regexp.QuoteMeta(c.srv.Destination()) + `$`,
		`^  cancel: +requested`,
		`^on ` + regexp.QuoteMeta(c.srv.Destination()) + `:$`,
		`^run lshow: cancelled \(cancel\), exit 143; reconcile: cancelled$`,
		` cancel INTENT cancel requested: cause cancel$`,
		` signal TERM to \S+ pgid \d+: pids \d+ \d+ \d+`,
		` final: cancelled \(cancel\), exit 143, .*nothing survived$`,
		`^journal: intact, \d+ lines, hash chain verified$`,
	} {
		if !regexp.MustCompile(`(?m)` + re).MatchString(out.String()) {
			t.Errorf("ledger show lacks a line matching %s:\n%s", re, out.String())
		}
	}
}
