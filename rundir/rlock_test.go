package rundir

import (
	"testing"
	"time"
)

// RLock: no lock file, nothing to wait for; an exclusive holder makes it
// busy after the wait; readers share it; a writer's Lock is free again
// once they let go.
func TestRLock(t *testing.T) {
	r := newRoot(t)
	d, err := r.Create("rlock-1")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	unlock, busy := d.RLock(time.Second)
	unlock()
	if busy || d.Exists(LockFile) {
		t.Fatalf("RLock without a lock file: busy %v, lock file created %v", busy, d.Exists(LockFile))
	}

	wunlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	unlock, busy = d.RLock(100 * time.Millisecond)
	unlock()
	if !busy || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("RLock under an exclusive lock: busy %v after %v, want busy after the wait", busy, time.Since(start))
	}
	wunlock()

	u1, busy1 := d.RLock(time.Second)
	u2, busy2 := d.RLock(time.Second)
	if busy1 || busy2 {
		t.Fatal("two readers do not share the lock")
	}
	u1()
	u2()
	done := make(chan struct{})
	go func() {
		unlock, err := d.Lock()
		if err == nil {
			unlock()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Lock is still blocked after the readers let go")
	}
}
