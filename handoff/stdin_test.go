package handoff

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// Frames carry the stream exactly, the EOF frame is io.EOF, and a
// connection that ends without it (mid-frame or between frames) is
// io.ErrUnexpectedEOF, never an end of file.
func TestFrames(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), MaxFrame/5) // two frames
	var b bytes.Buffer
	if err := WriteData(&b, data); err != nil {
		t.Fatal(err)
	}
	whole := append([]byte(nil), b.Bytes()...)
	if err := WriteEOF(&b); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(NewFrameReader(bytes.NewReader(b.Bytes())))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want %d, nil", len(got), err, len(data))
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"between-frames", whole},
		{"mid-frame", whole[:len(whole)-7]},
		{"mid-header", append(append([]byte(nil), whole...), 'd', 0)},
		{"empty", nil},
	} {
		r := NewFrameReader(bytes.NewReader(tc.in))
		got, err := io.ReadAll(r)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: err %v, want io.ErrUnexpectedEOF", tc.name, err)
		}
		if !bytes.HasPrefix(data, got) {
			t.Errorf("%s: %d bytes that are not the stream's first", tc.name, len(got))
		}
	}
	if _, err := io.ReadAll(NewFrameReader(bytes.NewReader([]byte{'x', 0, 0, 0, 1, 'a'}))); !errors.Is(err, ErrBadFrame) {
		t.Errorf("a frame of type x: %v, want ErrBadFrame", err)
	}
	if _, err := io.ReadAll(NewFrameReader(bytes.NewReader([]byte{'d', 0xff, 0, 0, 0}))); !errors.Is(err, ErrBadFrame) {
		t.Errorf("a frame past MaxFrame: %v, want ErrBadFrame", err)
	}
}
