// Package bigstack grows the main goroutine's stack once, to 64 KiB, before
// the other packages' init functions and main run.
//
// A goroutine starts with a 2 KiB stack and the runtime doubles it each time
// a call needs more. Each doubling copies the stack and walks every frame on
// it, reading each function's stack map and frame size from the binary's
// pclntab, which lies in pages spread over 3.4 MiB of the file, and the
// kernel maps 64 KiB of the file around each page first read. agent-wrap's
// start (about 110 package inits, then the command) doubles the main
// goroutine's stack several times: in a wrapper streaming 100 MB, perf
// record -e page-faults found 16 of the 121 file windows it faulted in first
// faulted by those walks, 5 of 109 with this package; the wrapper's peak
// RssFile went from 7528 to 6944 kB (medians of 5). Grown once, here, while the stack holds two
// frames, the walk reads two functions' tables. The 64 KiB are address
// space until used: only the pages the program writes become resident, as
// they would after the doublings.
//
// It imports nothing, so it is among the first packages initialised
// (packages are initialised in import-path order as their imports allow).
// main imports it for that alone.
package bigstack

// never is false; the compiler cannot know that, so grow keeps its frame.
var never bool

func init() { grow() }

// grow has a 48 KiB frame it never touches: its prologue's stack check makes
// the runtime move the stack to one large enough (64 KiB) in one copy.
//
//go:noinline
func grow() {
	if never {
		var b [48 << 10]byte
		sink(b[:])
	}
}

//go:noinline
func sink(b []byte) {}
