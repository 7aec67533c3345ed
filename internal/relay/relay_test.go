package relay

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string, within time.Duration) error {
	t.Helper()
	c.SetDeadline(time.Now().Add(within))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err == nil && got != msg+"\n" {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	return err
}

func TestRelayCutAndBlackhole(t *testing.T) {
	rl := Start(t, echo(t))
	c, err := net.Dial("tcp", rl.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(t, c, r, "one", 10*time.Second); err != nil {
		t.Fatalf("through the relay: %v", err)
	}

	// Blackholed: nothing comes back, nothing is closed.
	rl.Blackhole(true)
	err = roundTrip(t, c, r, "two", 300*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("blackholed: %v, want a timeout", err)
	}
	// Healed: the held bytes flow on.
	rl.Blackhole(false)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}

	// Cut: the connection ends; a new one works.
	rl.Cut()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read after Cut succeeded")
	}
	c2, err := net.Dial("tcp", rl.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := roundTrip(t, c2, bufio.NewReader(c2), "three", 10*time.Second); err != nil {
		t.Fatalf("a new connection after Cut: %v", err)
	}
}

func TestRelayHold(t *testing.T) {
	rl := Start(t, echo(t))
	c, err := net.Dial("tcp", rl.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(t, c, r, "one", 10*time.Second); err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	// Held: the open connection goes silent, a new one is relayed.
	rl.Hold()
	err = roundTrip(t, c, r, "two", 300*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("held: %v, want a timeout", err)
	}
	c2, err := net.Dial("tcp", rl.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := roundTrip(t, c2, bufio.NewReader(c2), "three", 10*time.Second); err != nil {
		t.Fatalf("a new connection while one is held: %v", err)
	}
	// Cut ends the held one.
	rl.Cut()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read after Cut succeeded")
	}
}

// TestListenClose: a relay made with Listen (no test to clean up after it)
// relays until Close, which ends the connections open then, a blackholed
// one included, and stops accepting new ones.
func TestListenClose(t *testing.T) {
	rl, err := Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			rl.Close()
		}
	})
	c, err := net.Dial("tcp", rl.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(t, c, r, "one", 10*time.Second); err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	rl.Blackhole(true)
	rl.Close()
	closed = true
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read after Close succeeded")
	}
	if c2, err := net.DialTimeout("tcp", rl.Addr(), 10*time.Second); err == nil {
		c2.Close()
		t.Fatal("a new connection after Close was accepted")
	}
}
