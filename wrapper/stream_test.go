package wrapper

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFollowWakesOnWrite: with a backstop longer than the test, every byte
// written to the log reaches the stream because inotify woke the follower,
// also after the follower has gone back to waiting; closing the wake pipe
// ends the follow at once, with the file copied to its end.
func TestFollowWakesOnWrite(t *testing.T) { testFollow(t, 0, time.Hour) }

// TestFollowLooksBeforeItWatches: before its watch is set up (here: never)
// the follower finds every write by looking at growing intervals, and ends
// as promptly.
func TestFollowLooksBeforeItWatches(t *testing.T) { testFollow(t, time.Hour, time.Hour) }

func testFollow(t *testing.T, watchAfter, backstop time.Duration) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "stdout.log")
	log, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	wakeR, wakeW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer wakeR.Close()
	done := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		ended <- follow(f, outW, done, int(wakeR.Fd()), watchAfter, backstop)
		outW.Close()
	}()

	got := make(chan []byte)
	go func() {
		for {
			b := make([]byte, 4096)
			n, err := outR.Read(b)
			if n > 0 {
				got <- b[:n]
			}
			if err != nil {
				close(got)
				return
			}
		}
	}()
	var seen bytes.Buffer
	expect := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for !bytes.HasSuffix(seen.Bytes(), []byte(want)) {
			select {
			case b, ok := <-got:
				if !ok {
					t.Fatalf("the stream ended before %q; got %q", want, seen.String())
				}
				seen.Write(b)
			case <-deadline:
				t.Fatalf("%q not streamed within 30 s (the backstop is an hour: neither inotify nor a look found it); got %q", want, seen.String())
			}
		}
	}
	for _, line := range []string{"first\n", "second\n", "third\n"} {
		if _, err := log.WriteString(line); err != nil {
			t.Fatal(err)
		}
		expect(line)
	}

	if _, err := log.WriteString("last\n"); err != nil {
		t.Fatal(err)
	}
	close(done)
	wakeW.Close()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("follow did not end within 30 s of the wake pipe's close (the backstop is an hour)")
	}
	for b := range got {
		seen.Write(b)
	}
	if want := "first\nsecond\nthird\nlast\n"; seen.String() != want {
		t.Fatalf("streamed %q, want %q", seen.String(), want)
	}
}
