package proc

import (
	"reflect"
	"testing"
)

// /proc/locks as the kernel writes it: holders of the wanted file (a
// flock and a POSIX lock by the same PID, listed once), a waiter ("->",
// not a holder), an open-file-description lock (PID -1, no one process),
// and locks on other files (another inode, another device).
func TestParseLocks(t *testing.T) {
	const locks = `1: FLOCK  ADVISORY  WRITE 4242 fe:00:9987568 0 EOF
1: -> FLOCK  ADVISORY  WRITE 5151 fe:00:9987568 0 EOF
2: POSIX  ADVISORY  WRITE 4242 fe:00:9987568 0 EOF
3: OFDLCK ADVISORY  WRITE -1 fe:00:9987568 0 EOF
4: FLOCK  ADVISORY  WRITE 6000 fe:00:9987569 0 EOF
5: FLOCK  ADVISORY  READ  6001 fe:01:9987568 0 EOF
6: FLOCK  ADVISORY  READ  6002 fe:00:9987568 0 EOF
`
	got := parseLocks([]byte(locks), 0xfe, 0, 9987568)
	if want := []int{4242, 6002}; !reflect.DeepEqual(got, want) {
		t.Fatalf("holders %v, want %v", got, want)
	}
	if got := parseLocks([]byte("garbage\n\n1: FLOCK\n"), 0xfe, 0, 1); got != nil {
		t.Fatalf("holders %v from garbage, want none", got)
	}
}
