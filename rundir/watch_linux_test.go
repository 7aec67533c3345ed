package rundir

import (
	"testing"
	"time"
)

// Replaced wakes its reader once name is replaced by a rename (how
// WriteAtomic writes), through the real inotify and the runtime's poller,
// and again for each replacement after a receive. Which names wake it is
// TestReplacedIn's.
func TestReplaced(t *testing.T) {
	r := newRoot(t)
	d, err := r.Create("job")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, stop, err := d.Replaced(DeadlineFile)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	recv := func(what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatalf("no wake within 30 s of %s", what)
		}
	}
	// Other files change around it, as a run's do.
	if err := d.WriteAtomic(StatusFile, []byte("{}"), Visible); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteOnce(PIDFile, []byte("1\n")); err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"100\n", "200\n"} {
		if err := d.WriteAtomic(DeadlineFile, []byte(v), Visible); err != nil {
			t.Fatal(err)
		}
		recv("deadline_epoch replaced, time " + string(rune('1'+i)))
	}
}

// replacedIn parses a batch of inotify events: a name matches only whole,
// padding is ignored, an overflow always matches.
func TestReplacedIn(t *testing.T) {
	event := func(mask uint32, name string) []byte {
		n := (len(name) + 16) &^ 15 // padded with NULs, as the kernel does
		if name == "" {
			n = 0
		}
		b := make([]byte, 16+n)
		b[4], b[5], b[6], b[7] = byte(mask), byte(mask>>8), byte(mask>>16), byte(mask>>24)
		b[12] = byte(n)
		copy(b[16:], name)
		return b
	}
	const movedTo, overflow = 0x80, 0x4000
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	for _, c := range []struct {
		b    []byte
		want bool
	}{
		{event(movedTo, "deadline_epoch"), true},
		{cat(event(movedTo, "status.json"), event(movedTo, "deadline_epoch")), true},
		{cat(event(movedTo, "status.json"), event(movedTo, "deadline_epoch.x")), false},
		{event(movedTo, "deadline_epoc"), false},
		{event(overflow, ""), true},
		{nil, false},
	} {
		if got := replacedIn(c.b, DeadlineFile); got != c.want {
			t.Errorf("replacedIn(%q) = %v, want %v", c.b, got, c.want)
		}
	}
}
