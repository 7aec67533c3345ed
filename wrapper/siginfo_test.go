package wrapper

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// childInfo decodes si_pid and si_status from the opaque unix.Siginfo; check
// it against real children, without reaping them first (WNOWAIT), as the
// supervisor does.
func TestChildInfo(t *testing.T) {
	for _, tc := range []struct {
		argv   []string
		code   int32
		status int
	}{
		{[]string{"sh", "-c", "exit 7"}, _CLD_EXITED, 7},
		{[]string{"sh", "-c", "kill -TERM $$"}, 2 /* CLD_KILLED */, int(unix.SIGTERM)},
	} {
		cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			t.Fatal(err)
		}
		gotPID, status := childInfo(&info)
		if gotPID != pid || info.Code != tc.code || status != tc.status {
			t.Errorf("%v: pid %d code %d status %d, want %d %d %d", tc.argv, gotPID, info.Code, status, pid, tc.code, tc.status)
		}
		// WNOWAIT left it unreaped: Wait still gets the same outcome.
		cmd.Wait()
		if ws := cmd.ProcessState.Sys().(interface{ ExitStatus() int }); tc.code == _CLD_EXITED && ws.ExitStatus() != tc.status {
			t.Errorf("after WNOWAIT, Wait saw %d", ws.ExitStatus())
		}
	}
}
