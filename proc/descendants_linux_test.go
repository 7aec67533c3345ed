package proc

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// Descendants finds a child, its child and a grandchild in a session of
// its own (setsid), through the children files and through a scan of the
// whole table alike.
func TestDescendants(t *testing.T) {
	c := exec.Command("sh", "-c", "sleep 300 & setsid sleep 301 & wait")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if ds, err := Descendants(c.Process.Pid); err == nil {
			for _, d := range ds {
				syscall.Kill(d.PID, syscall.SIGKILL) // the test's own grandchildren, still unreaped by sh
			}
		}
		c.Process.Kill()
		c.Wait()
	}()
	pids := func(ss []Stat) []int {
		var out []int
		for _, s := range ss {
			out = append(out, s.PID)
		}
		slices.Sort(out)
		return out
	}
	var got []Stat
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		got, err = Descendants(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range got {
			if s.Comm == "sleep" {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Descendants never showed sh and its two sleeps: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got[0].PID != c.Process.Pid || len(got) != 3 {
		t.Fatalf("Descendants = %+v; want sh %d first, then its two sleeps", got, c.Process.Pid)
	}
	if _, ok := Children(os.Getpid()); !ok {
		t.Log("no children files here: Descendants read the whole table")
	}
	byScan, err := descendantsByScan(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pids(got), pids(byScan)) {
		t.Fatalf("children files found %v, the scan %v", pids(got), pids(byScan))
	}
}
