package agentrelay

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agent-wrap/agent-wrap/internal/privsock"
)

// SocketName is the relay's socket in a run directory.
const SocketName = "agent.sock"

// SocketPath returns where the relay of the run in runDir listens:
// runDir/agent.sock when that fits in a socket address, else a short name
// derived from runDir (so one run directory always has one socket path) in
// a private per-user directory, $XDG_RUNTIME_DIR/agent-wrap or
// /tmp/agent-wrap-UID, created mode 0700 and refused when it is a symlink,
// someone else's or open to group or others.
func SocketPath(runDir string, getenv func(string) string) (string, error) {
	return SocketPathNamed(runDir, SocketName, getenv)
}

// SocketPathNamed is SocketPath for another socket of the run, runDir/name
// (the wrapper's control socket): the short name is derived from runDir
// and name, so two sockets of one run never share it.
func SocketPathNamed(runDir, name string, getenv func(string) string) (string, error) {
	p := filepath.Join(runDir, name)
	if len(p) <= privsock.MaxPath {
		return p, nil
	}
	seed := runDir
	if name != SocketName {
		seed = p
	}
	sum := sha256.Sum256([]byte(seed))
	short := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:15])) + ".sock"
	var dirs []string
	if rt := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(rt) {
		dirs = append(dirs, filepath.Join(rt, "agent-wrap"))
	}
	dirs = append(dirs, "/tmp/agent-wrap-"+strconv.Itoa(os.Geteuid()))
	var firstErr error
	for _, dir := range dirs {
		p := filepath.Join(dir, short)
		if len(p) > privsock.MaxPath {
			continue
		}
		err := privsock.Dir(dir)
		if err == nil {
			return p, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("no directory short enough for a socket path")
	}
	return "", fmt.Errorf("socket %s for %s: %w", name, runDir, firstErr)
}
