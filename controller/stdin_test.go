package controller

import (
	"bytes"
	"crypto/rand"
	"io"
	"testing"
	"testing/iotest"

	"github.com/agent-wrap/agent-wrap/handoff"
)

// readFrames returns what a sender wrote to its pipe, as the host reads it.
func readFrames(t *testing.T, r io.Reader) ([]byte, error) {
	t.Helper()
	return io.ReadAll(handoff.NewFrameReader(r))
}

// One connection gets the stream whole, then its end of file; a second
// (a reattach) is sent again from the oldest byte kept, which with a
// small bound is far past the start, and gets the bytes from there, the
// end of file included.
func TestStdinStreamResend(t *testing.T) {
	src := make([]byte, 1<<20)
	if _, err := rand.Read(src); err != nil {
		t.Fatal(err)
	}
	const keep = 64 << 10
	s := newStdinStream(bytes.NewReader(src), keep)

	snd := s.sender()
	if snd.from != 0 {
		t.Fatalf("first sender from %d, want 0", snd.from)
	}
	pr, pw := io.Pipe()
	go snd.run(pw)
	got, err := readFrames(t, pr)
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("first connection: %d bytes, %v; want the %d bytes and EOF", len(got), err, len(src))
	}

	s.mu.Lock()
	kept := s.end - s.start
	s.mu.Unlock()
	if kept > keep+64<<10 {
		t.Errorf("kept %d bytes, more than the bound %d and a read", kept, keep)
	}
	snd2 := s.sender()
	if snd2.from <= 0 || snd2.from < int64(len(src))-keep-64<<10 {
		t.Errorf("second sender from %d: want the oldest byte kept, within %d of the end", snd2.from, keep+64<<10)
	}
	pr2, pw2 := io.Pipe()
	go snd2.run(pw2)
	got, err = readFrames(t, pr2)
	if err != nil || !bytes.Equal(got, src[snd2.from:]) {
		t.Errorf("second connection: %d bytes, %v; want the %d bytes from %d and EOF", len(got), err, int64(len(src))-snd2.from, snd2.from)
	}
}

// A connection that cannot take the stream (the job does not read) holds
// the reading: no byte is dropped that was never sent, so a reattach from
// the start loses nothing.
func TestStdinStreamHoldsUnsent(t *testing.T) {
	src := make([]byte, 512<<10)
	if _, err := rand.Read(src); err != nil {
		t.Fatal(err)
	}
	s := newStdinStream(bytes.NewReader(src), 64<<10)
	snd := s.sender()
	pr, pw := io.Pipe()
	go snd.run(pw)
	// Take one frame's header and some bytes, then stop reading.
	head := make([]byte, 5+100)
	if _, err := io.ReadFull(pr, head); err != nil {
		t.Fatal(err)
	}
	snd.stop()
	pr.Close()
	s.mu.Lock()
	start := s.start
	s.mu.Unlock()
	snd2 := s.sender()
	if snd2.from != start {
		t.Fatalf("second sender from %d, want the oldest byte kept (%d)", snd2.from, start)
	}
	pr2, pw2 := io.Pipe()
	go snd2.run(pw2)
	got, err := readFrames(t, pr2)
	if err != nil || !bytes.Equal(got, src[snd2.from:]) {
		t.Errorf("second connection: %d bytes from %d, %v; want the rest and EOF", len(got), snd2.from, err)
	}
}

func TestStdinKeepFromEnv(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int64
		bad  bool
	}{
		{"", 0, false},
		{"65536", 65536, false},
		{"512K", 512 << 10, false},
		{"64m", 64 << 20, false},
		{"1G", 1 << 30, false},
		{"100", 0, true}, // below a frame's worth
		{"lots", 0, true},
		{"-1M", 0, true},
		{"K", 0, true},
	} {
		got, err := StdinKeepFromEnv(func(string) string { return tc.v })
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%s=%q: %d, %v; want %d, error %v", EnvStdinKeep, tc.v, got, err, tc.want, tc.bad)
		}
	}
}

// Reads of one byte (a terminal, a slow writer) fill a chunk before the
// next is made: the kept bytes stay a few chunks, and arrive whole.
func TestStdinStreamSmallReads(t *testing.T) {
	src := bytes.Repeat([]byte("abcdefgh"), 20<<10) // 160 KiB
	s := newStdinStream(iotest.OneByteReader(bytes.NewReader(src)), 1<<20)
	snd := s.sender()
	pr, pw := io.Pipe()
	go snd.run(pw)
	got, err := readFrames(t, pr)
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("%d bytes, %v; want the %d bytes and EOF", len(got), err, len(src))
	}
	s.mu.Lock()
	n := len(s.chunks)
	s.mu.Unlock()
	if want := len(src)/chunkSize + 1; n > want {
		t.Errorf("%d chunks kept for %d bytes read one at a time, want at most %d", n, len(src), want)
	}
}
