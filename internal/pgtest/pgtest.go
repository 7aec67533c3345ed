// Package pgtest starts a private PostgreSQL server for a test binary, so
// that the ledger's PostgreSQL backend is proven against the real server.
//
// What Start guarantees:
//   - The server's binaries are found through `pg_config --bindir`, else
//     /usr/lib/postgresql/*/bin (Debian keeps them off PATH). Where there
//     is none, Start fails with the command that installs them (the
//     `postgresql` package, as .ci/deps does); it never skips.
//   - initdb and postgres run as uid/gid 65534 (setpriv --reuid 65534
//     --regid 65534 --clear-groups; initdb refuses root), in a fresh
//     temporary directory made for that user: the data directory, and a
//     unix socket directory of its own. TCP listens on 127.0.0.1 only, on a
//     port that was free when chosen. Local (socket) logins are trusted;
//     TCP logins need a password (scram-sha-256), so a test that needs a
//     wrong password can have one.
//   - When Start returns, a connection as the superuser "postgres" works.
//   - Stop stops the server by the PID it started (postmaster.pid names the
//     same one): SIGINT (a fast shutdown), then SIGKILL if it lingers, and
//     removes the directory. setpriv's --pdeathsig KILL makes the server
//     die with the test binary if the binary dies without calling Stop.
//     Nothing is ever looked up by name.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// uid is the account the server runs as.
const uid = 65534

// Server is a running private PostgreSQL.
type Server struct {
	BinDir string
	Dir    string // owned by uid: data/, sock/, log
	Port   int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Missing says how to install PostgreSQL when its server binaries cannot
// be found, else nil.
func Missing() error {
	_, err := binDir()
	return err
}

func binDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server found (no initdb under `pg_config --bindir` or /usr/lib/postgresql/*/bin); " +
		"install it with: apt-get install postgresql (or run .ci/deps as root)")
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// Start initialises and starts a server. The caller Stops it.
func Start() (*Server, error) {
	bd, err := binDir()
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		return nil, errors.New("setpriv is missing (util-linux): it runs PostgreSQL as uid 65534")
	}
	dir, err := os.MkdirTemp("", "agent-wrap-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{BinDir: bd, Dir: dir}
	if err := s.init(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var lastErr error
	for range 5 { // a port free when chosen may be taken before the server binds it
		if s.Port, err = freePort(); err != nil {
			return nil, err
		}
		if lastErr = s.Restart(); lastErr == nil {
			return s, nil
		}
	}
	s.Stop()
	return nil, lastErr
}

func (s *Server) as(name string, args ...string) *exec.Cmd {
	a := []string{"--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(uid), "--clear-groups", "--pdeathsig", "KILL", "--", filepath.Join(s.BinDir, name)}
	cmd := exec.Command("setpriv", append(a, args...)...)
	cmd.Dir = s.Dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "TZ=UTC"}
	return cmd
}

func (s *Server) init() error {
	if err := os.Chown(s.Dir, uid, uid); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(s.Dir, "sock"), 0o755); err != nil {
		return err
	}
	if err := os.Chown(filepath.Join(s.Dir, "sock"), uid, uid); err != nil {
		return err
	}
	out, err := s.as("initdb", "-D", filepath.Join(s.Dir, "data"), "-U", "postgres", "--auth-local=trust",
		"--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

// SocketDir is the directory of the server's unix socket.
func (s *Server) SocketDir() string { return filepath.Join(s.Dir, "sock") }

// URL is a URL for database db as user (over the unix socket, trusted).
func (s *Server) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@/%s?host=%s&port=%d&sslmode=disable", user, db, s.SocketDir(), s.Port)
}

// TCPURL is a URL for database db as user with password, over TCP.
func (s *Server) TCPURL(user, password, db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", user, password, s.Port, db)
}

// Restart starts the server (again, after StopImmediate) on the same
// data directory and port, and waits until it takes connections (after
// a crash, once its recovery is done).
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("pgtest: the server is running")
	}
	logf, err := os.OpenFile(filepath.Join(s.Dir, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := s.as("postgres", "-D", filepath.Join(s.Dir, "data"), "-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.SocketDir(),
		"-c", "fsync=off", "-c", "max_connections=300", "-c", "shared_buffers=16MB")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pgconn.Connect(ctx, s.URL("postgres", "postgres"))
		cancel()
		if err == nil {
			c.Close(context.Background())
			s.cmd, s.done = cmd, done
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
			return fmt.Errorf("postgres exited at start: %s", tailOf(b))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("postgres did not take connections within 60s: %v", err)
		}
	}
}

func tailOf(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// PID is the postmaster's PID (0 when stopped), as postmaster.pid says.
func (s *Server) PID() int {
	b, err := os.ReadFile(filepath.Join(s.Dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	n, _ := strconv.Atoi(string(line))
	return n
}

// StopImmediate stops the server as `pg_ctl stop -m immediate` does, as
// in a crash: SIGQUIT to the postmaster, by the PID it was started with
// (which postmaster.pid names too); it drops every connection and exits
// without a checkpoint. It returns once the process has exited.
func (s *Server) StopImmediate() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("pgtest: the server is not running")
	}
	if pid := s.PID(); pid != s.cmd.Process.Pid {
		return fmt.Errorf("pgtest: postmaster.pid says %d, the server started is %d", pid, s.cmd.Process.Pid)
	}
	if err := s.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		return err
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		return errors.New("postgres still running 30s after SIGQUIT")
	}
	s.cmd = nil
	return nil
}

// Reap waits up to d for a server killed from outside (a SIGKILL of the
// postmaster, as a test's nemesis sends) to exit, and forgets it, so that
// Restart can start it again. A new postmaster refuses to start while a
// backend of the old one is alive: the caller waits for those too.
func (s *Server) Reap(d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("pgtest: the server is not running")
	}
	select {
	case <-s.done:
	case <-time.After(d):
		return fmt.Errorf("pgtest: the postmaster (pid %d) still runs %v later", s.cmd.Process.Pid, d)
	}
	s.cmd = nil
	return nil
}

// Stop stops the server by its PID and removes its directory.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(s.Dir)
}

var dbSeq atomic.Int64

// NewDB creates a fresh, empty database and returns its name.
func (s *Server) NewDB(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	if err := s.Exec(ctx, "postgres", "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return name, nil
}

// Exec runs SQL (one or more statements, no parameters) as the superuser
// in database db.
func (s *Server) Exec(ctx context.Context, db, sql string) error {
	_, err := s.Query(ctx, db, sql)
	return err
}

// Query runs one statement as the superuser in database db, its
// arguments as text, and returns its rows as text.
func (s *Server) Query(ctx context.Context, db, sql string, args ...string) ([][]string, error) {
	c, err := pgconn.Connect(ctx, s.URL("postgres", db))
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	if len(args) == 0 {
		res, err := c.Exec(ctx, sql).ReadAll()
		if err != nil || len(res) == 0 {
			return nil, err
		}
		return texts(res[len(res)-1].Rows), nil
	}
	vals := make([][]byte, len(args))
	for i, a := range args {
		vals[i] = []byte(a)
	}
	res := c.ExecParams(ctx, sql, vals, nil, nil, nil).Read()
	return texts(res.Rows), res.Err
}

func texts(rows [][][]byte) [][]string {
	out := make([][]string, len(rows))
	for i, r := range rows {
		out[i] = make([]string, len(r))
		for j, v := range r {
			out[i][j] = string(v)
		}
	}
	return out
}

// Connections counts the server's client connections to database db.
func (s *Server) Connections(ctx context.Context, db string) (int, error) {
	rows, err := s.Query(ctx, "postgres", `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(rows[0][0])
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
