package httpgw

// The caller of a TCP connection. The kernel gives no peer credentials for
// TCP, but a loopback connection has both ends on this host: the client's
// socket is the one whose local address is the connection's remote address
// and whose remote address is the gateway's port. Its line in
// /proc/net/tcp gives its owner's uid and its inode, and the process that
// holds it has a descriptor linked to "socket:[INODE]" in /proc/PID/fd.
// That process is looked for among the run's processes first (a few
// directories), then, to name an outsider in the journal, among the
// processes of the socket's owner. This is done once, at accept (the
// client end exists from connect on); the start time found then is checked
// again on every request, as for the unix socket's SO_PEERCRED.
//
// A socket that is not in the table (it was closed meanwhile, or is in
// another network namespace) or whose holder cannot be found is
// caller_unknown.

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/proc"
)

// tcpPeer identifies the process holding the client end of nc.
func tcpPeer(nc *net.TCPConn, members []int) (Caller, string) {
	local, ok1 := addrPort(nc.LocalAddr())
	remote, ok2 := addrPort(nc.RemoteAddr())
	if !ok1 || !ok2 {
		return Caller{UID: -1}, ReasonCallerUnknown
	}
	uid, inode, ok := findTCPSocket(remote, local)
	if !ok {
		return Caller{UID: -1}, ReasonCallerUnknown
	}
	if uid != os.Geteuid() {
		return Caller{UID: uid}, authority.ReasonOtherUser
	}
	link := []byte("socket:[" + strconv.FormatUint(inode, 10) + "]")
	for _, pid := range members {
		if holds(pid, link) {
			return callerOf(pid, uid)
		}
	}
	if pid := findHolder(link, uid, members); pid > 0 {
		return callerOf(pid, uid)
	}
	return Caller{UID: uid}, ReasonCallerUnknown
}

func callerOf(pid, uid int) (Caller, string) {
	st, err := proc.ReadStat(pid)
	if err != nil || st.Dead() {
		return Caller{PID: pid, UID: uid}, authority.ReasonCallerGone
	}
	return Caller{PID: pid, UID: uid, Start: st.Start}, ""
}

func addrPort(a net.Addr) (netip.AddrPort, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := ta.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ap.IsValid()
}

// procNetAddr is an address as /proc/net/tcp prints it: the IPv4 address
// as a host-order 32-bit word in hex (little-endian on the machines this
// runs on: the bytes reversed), a colon, the port in hex.
func procNetAddr(ap netip.AddrPort) string {
	b := ap.Addr().As4()
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", b[3], b[2], b[1], b[0], ap.Port())
}

// findTCPSocket finds the socket with local address local and remote
// address remote in /proc/net/tcp and returns its owner and inode.
func findTCPSocket(local, remote netip.AddrPort) (uid int, inode uint64, ok bool) {
	if !local.Addr().Is4() || !remote.Addr().Is4() {
		return 0, 0, false
	}
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, 0, false
	}
	want := []byte(" " + procNetAddr(local) + " " + procNetAddr(remote) + " ")
	i := bytes.Index(table, want)
	if i < 0 {
		return 0, 0, false
	}
	end := bytes.IndexByte(table[i:], '\n')
	if end < 0 {
		end = len(table) - i
	}
	// sl local rem st tx:rx tr:tm retrnsmt uid timeout inode ...; the line
	// from the local address on.
	f := bytes.Fields(table[i : i+end])
	if len(f) < 9 {
		return 0, 0, false
	}
	u, err1 := strconv.Atoi(string(f[6]))
	n, err2 := strconv.ParseUint(string(f[8]), 10, 64)
	if err1 != nil || err2 != nil || n == 0 {
		return 0, 0, false
	}
	return u, n, true
}

// holds reports whether process pid has a descriptor linked to link.
func holds(pid int, link []byte) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	names, _ := f.Readdirnames(-1)
	f.Close()
	buf := make([]byte, 64)
	for _, name := range names {
		n, err := readlink(dir+name, buf)
		if err == nil && bytes.Equal(buf[:n], link) {
			return true
		}
	}
	return false
}

// findHolder looks for the holder among every process of uid (skipping
// the ones already looked at).
func findHolder(link []byte, uid int, skip []int) int {
	all, err := proc.Scan()
	if err != nil {
		return 0
	}
	seen := map[int]bool{os.Getpid(): true}
	for _, p := range skip {
		seen[p] = true
	}
	for _, p := range all {
		if seen[p.PID] || p.Dead() {
			continue
		}
		if fi, err := os.Stat("/proc/" + strconv.Itoa(p.PID)); err != nil || ownerOf(fi) != uid {
			continue
		}
		if holds(p.PID, link) {
			return p.PID
		}
	}
	return 0
}
