package watchdog

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestNotify(t *testing.T) {
	t.Run("no-socket", func(t *testing.T) {
		t.Setenv("NOTIFY_SOCKET", "")
		if sent, err := EnvNotifier().Notify("READY=1"); sent || err != nil {
			t.Errorf("Notify without NOTIFY_SOCKET = %v, %v; want false, nil", sent, err)
		}
	})
	for _, abstract := range []bool{false, true} {
		name := filepath.Join(t.TempDir(), "notify")
		env := name
		if abstract {
			name = "\x00agent-wrap-test-" + strconv.Itoa(os.Getpid())
			env = "@" + name[1:]
		}
		t.Run("abstract="+strconv.FormatBool(abstract), func(t *testing.T) {
			l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			t.Setenv("NOTIFY_SOCKET", env)
			if sent, err := EnvNotifier().Notify("READY=1"); !sent || err != nil {
				t.Fatalf("Notify = %v, %v", sent, err)
			}
			buf := make([]byte, 64)
			if err := l.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			n, err := l.Read(buf)
			if err != nil || string(buf[:n]) != "READY=1" {
				t.Errorf("received %q, %v", buf[:n], err)
			}
		})
	}
}

func TestWatchdogInterval(t *testing.T) {
	me := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name, usec, pid string
		want            time.Duration
	}{
		{"unset", "", "", 0},
		{"30s", "30000000", "", 15 * time.Second},
		{"30s-this-pid", "30000000", me, 15 * time.Second},
		{"30s-other-pid", "30000000", "1", 0},
		{"garbage", "soon", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", tc.pid)
			if got := EnvNotifier().WatchdogInterval; got != tc.want {
				t.Errorf("EnvNotifier().WatchdogInterval = %v, want %v", got, tc.want)
			}
		})
	}
}
