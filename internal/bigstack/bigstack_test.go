package bigstack

import (
	"os"
	"testing"
	"unsafe"
)

// moved reports whether a call needing about 40 KiB of stack moved the
// calling goroutine's stack (the runtime copies a stack to grow it, so the
// address of a local, taken as a number before the call, no longer matches).
//
//go:noinline
func moved() bool {
	var x byte
	before := uintptr(unsafe.Pointer(&x))
	deep(40)
	return before != uintptr(unsafe.Pointer(&x))
}

// deep uses n KiB of stack, one frame per KiB.
//
//go:noinline
func deep(n int) byte {
	var b [1000]byte
	b[n%len(b)] = byte(n)
	if n > 0 {
		b[0] = deep(n - 1)
	}
	return b[0] + b[n%len(b)]
}

var mainMoved bool

// TestMain runs on the main goroutine, whose stack init grew: a call
// needing 40 KiB must fit without a move.
func TestMain(m *testing.M) {
	mainMoved = moved()
	os.Exit(m.Run())
}

func TestMainGoroutineStackGrownAtInit(t *testing.T) {
	if mainMoved {
		t.Fatal("the main goroutine's stack moved on a 40 KiB call after init: init did not grow it")
	}
}

// TestCheckSeesAMove proves the check itself: on a new goroutine, which
// starts with a small stack, the same call moves the stack.
func TestCheckSeesAMove(t *testing.T) {
	done := make(chan bool)
	go func() { done <- moved() }()
	if !<-done {
		t.Fatal("a new goroutine's stack did not move on a 40 KiB call: the check cannot see a move")
	}
}
