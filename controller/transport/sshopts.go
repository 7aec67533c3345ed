package transport

import (
	"regexp"
	"strings"
	"sync"
)

// logLevelOpts returns the LogLevel to give OpenSSH's client, ahead of
// the user's words so that it holds (ssh takes an option's first value):
// VERBOSE, for the "Authenticated to" line that tells a launch that may
// have sent its command from one that cannot have. The log is the
// controller's own (-E): ssh's words never reach the job's streams.
func logLevelOpts(rsh []string) []string {
	if !IsSSH(rsh) {
		return nil
	}
	return []string{"-o", "LogLevel=VERBOSE"}
}

// SSHNoArgFlags are OpenSSH's flags that take no argument, so a word made
// of them is a group of flags.
const SSHNoArgFlags = "46AaCfGgKkMNnqsTtVvXxYy"

// Compiled on first use: every agent-wrap command, a wrapper too, would
// otherwise compile them at start, the largest package init on the run
// path (about 0.2 ms and 84 allocations).
var (
	quietGroup = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^-[` + SSHNoArgFlags + `]*q[` + SSHNoArgFlags + `]*$`)
	})
	socketFlag = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^-[` + SSHNoArgFlags + `]*S`) })
)

// QuietFlag reports whether the rsh words hold -q, which silences ssh's
// log whatever LogLevel says.
func QuietFlag(rsh []string) bool {
	for _, w := range rsh[1:] {
		if quietGroup().MatchString(w) {
			return true
		}
	}
	return false
}

// MuxPossible reports whether a call may go over a shared connection
// (ControlPath, -S), which sends the command without a login of its own.
// A mention anywhere in the rsh words or the ssh configuration counts.
func MuxPossible(rsh []string) bool {
	for _, w := range rsh[1:] {
		if strings.Contains(strings.ToLower(w), "controlpath") || socketFlag().MatchString(w) {
			return true
		}
	}
	return configMentions(rsh, "controlpath") != notMentioned
}

// sshReason returns the last line of ssh's log that can say why a
// connection ended: not the lines LogLevel VERBOSE adds to every
// connection (the login, the byte counts) nor the known-hosts notice.
func sshReason(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		switch {
		case l == "",
			strings.HasPrefix(l, "Authenticated to "),
			strings.HasPrefix(l, "Transferred: "),
			strings.HasPrefix(l, "Bytes per second: "),
			strings.HasPrefix(l, "Warning: Permanently added "):
			continue
		}
		return l
	}
	return ""
}
