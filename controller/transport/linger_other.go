//go:build !linux

package transport

import "time"

// killLingering gives the process recorded as pid, started at start (a
// ControlMaster told to exit), up to within to exit, and SIGKILLs it if it
// has not. Without pidfds the check and the signal are two steps.
func killLingering(pid int, start uint64, within time.Duration) {
	killLingeringByLooking(pid, start, within)
}
