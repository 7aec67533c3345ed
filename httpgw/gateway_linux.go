package httpgw

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/authority"
	"github.com/agent-wrap/agent-wrap/internal/privsock"
	"github.com/agent-wrap/agent-wrap/proc"
)

// Reasons the gateway itself gives for refusing, whatever the Check says,
// besides the callers every gateway refuses (authority.ReasonCallerGone,
// authority.ReasonOtherUser).
const (
	ReasonCallerUnknown = "caller_unknown" // no process of this host holds the client end
	ReasonMethod        = "method_not_allowed"
	ReasonOutside       = "outside_prefix"
	ReasonUpgrade       = "upgrade_refused" // Upgrade (websocket, h2c), CONNECT, HTTP/2 prior knowledge
)

// Header names the gateway sets on its own answers.
const (
	HeaderDecision = "X-Agent-Wrap-Decision"
)

// Caller is the process at the other end of a connection.
type Caller struct {
	PID   int
	UID   int
	Start uint64 // start time in clock ticks since boot, read at accept
}

// Request is one request as the gateway saw it. It holds nothing secret:
// no header, no body, no query string.
type Request struct {
	Gateway string // the gateway's NAME
	Method  string
	// Target is the upstream HOST/PATH the request goes to (the path as
	// the client sent it when it is refused as outside the prefix), with
	// no query string.
	Target string
	Caller Caller
	// Refusal is set when the gateway refuses whatever the Check says; the
	// Check is still called, to record it, and must refuse.
	Refusal string
}

// Decision is the Check's answer. Seq is the journal's sequence number of
// the decision, given back in a refusal and with the request's End.
type Decision struct {
	Allow  bool
	Reason string
	Seq    int64
}

// Check decides one request and records it, before anything is sent
// upstream. Calls may run at the same time.
type Check func(Request) Decision

// End is how an accepted request ended.
type End struct {
	Seq       int64
	Status    int   // the upstream's status; 0 when none reached the client
	BytesUp   int64 // request body bytes read from the client
	BytesDown int64 // response body bytes written to the client
	Duration  time.Duration
	Cut       bool // revocation aborted it
}

// Config is one gateway to listen on.
type Config struct {
	Spec   *Spec
	RunID  string // named in refusals
	Socket string // the unix socket's path (see agentrelay.SocketPathNamed)
	Check  Check
	// Ended is called once per accepted request, when it has ended
	// (cut ones included), before Wait returns.
	Ended func(End)
	// Members lists the PIDs of the run's processes, among which the
	// holder of a TCP connection's client end is looked for first.
	Members func() []int
}

// Gateway is a listening gateway.
type Gateway struct {
	cfg     Config
	spec    *Spec
	tcp     net.Listener
	unixLn  *net.UnixListener
	base    string // http://127.0.0.1:PORT
	srv     *http.Server
	proxy   *httputil.ReverseProxy
	tr      *http.Transport
	header  string // the rendered credential header value, "" without a secret
	upstrHP string // upstream host[:port], for targets

	mu      sync.Mutex
	revoked bool
	flights map[*flight]struct{}
	cut     []int64
	wg      sync.WaitGroup
	served  sync.WaitGroup
}

// flight is one request being decided or forwarded.
type flight struct {
	ctx     context.Context
	cancel  context.CancelFunc
	seq     int64
	cut     bool   // in flight when Revoke was called
	outPath string // escaped upstream path
	status  int
}

type ctxKey int

const (
	connKey ctxKey = iota
	flightKey
)

// connInfo is what was learnt of a connection at accept.
type connInfo struct {
	caller  Caller
	refusal string // caller_unknown or other_user, for every request on it
}

var discardLog = log.New(io.Discard, "", 0)

// copyBuffers are the bodies' copy buffers: 256 KiB, against
// ReverseProxy's 32 KiB, so that a large download costs fewer reads and
// writes; pooled, so an idle gateway holds none for long.
var copyBuffers = &bufferPool{}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 256<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// Listen starts the gateway on 127.0.0.1 (a port the kernel picks) and on
// the unix socket cfg.Socket (mode 0600; a stale socket there is replaced).
func Listen(cfg Config) (*Gateway, error) {
	s := cfg.Spec
	if cfg.Check == nil || s == nil {
		return nil, errors.New("httpgw: no check or no spec")
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(s.CAPEM) > 0 {
		// The given roots instead of the system's: the upstream is pinned
		// to its private CA, and the wrapper does not parse the system's
		// hundred-odd roots (about 4 MiB of memory per run) for an upstream
		// that does not use them.
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.CAPEM)
		tlsConf.RootCAs = pool
	}
	g := &Gateway{cfg: cfg, spec: s, flights: map[*flight]struct{}{}, upstrHP: s.Upstream.Host}
	if s.HasSecret() {
		g.header = s.headerValue()
	}
	g.tr = &http.Transport{
		Proxy:       nil, // HTTPS_PROXY must not divert the credential
		DialContext: upstreamDialer.DialContext,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialTLS(ctx, network, addr, tlsConf)
		},
		MaxIdleConns:        16,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // bodies pass as they are
		WriteBufferSize:     64 << 10,
		// HTTP/1.1 to the upstream: aborting a request closes its
		// connection, which is what revocation promises.
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      g.tr,
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.upstreamError,
		ErrorLog:       discardLog,
		BufferPool:     copyBuffers,
		FlushInterval:  flushEvery, // countingWriter gathers between flushes
	}
	g.srv = &http.Server{
		Handler:           g,
		ConnContext:       g.identify,
		ReadHeaderTimeout: 60 * time.Second,
		ErrorLog:          discardLog,
		MaxHeaderBytes:    1 << 20,
	}
	g.srv.SetKeepAlivesEnabled(true)

	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("httpgw %s: %w", s.Name, err)
	}
	un, err := privsock.Listen(cfg.Socket) // Revoke removes it
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("httpgw %s: %w", s.Name, err)
	}
	g.tcp, g.unixLn = tcp, un
	g.base = "http://" + tcp.Addr().String()
	for _, ln := range []net.Listener{tcp, un} {
		g.served.Add(1)
		go func() {
			defer g.served.Done()
			_ = g.srv.Serve(ln)
		}()
	}
	return g, nil
}

// URL is the job's base URL, http://127.0.0.1:PORT.
func (g *Gateway) URL() string { return g.base }

// Socket is the unix socket's path.
func (g *Gateway) Socket() string { return g.cfg.Socket }

// Revoke ends the gateway: both listeners are closed, the socket removed,
// every client connection closed and every request in flight aborted with
// its upstream connection. Nothing is accepted or forwarded after it
// returns. It may be called more than once; the error is the removal's.
func (g *Gateway) Revoke() error {
	g.mu.Lock()
	if g.revoked {
		g.mu.Unlock()
		return nil
	}
	g.revoked = true
	for f := range g.flights {
		f.cut = true
		f.cancel()
	}
	g.mu.Unlock()
	_ = g.srv.Close() // listeners and every connection, idle or active
	err := os.Remove(g.cfg.Socket)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	g.tr.CloseIdleConnections()
	return err
}

// Wait waits, after Revoke, for every request handler to return (each
// accepted one has had its Ended call) and returns the sequence numbers of
// the accepted requests that revocation cut, in the order they ended.
func (g *Gateway) Wait() []int64 {
	g.wg.Wait()
	g.served.Wait()
	g.tr.CloseIdleConnections()
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int64(nil), g.cut...)
}

// identify learns who is at the other end of a new connection: SO_PEERCRED
// on the unix socket; on TCP the holder of the client's socket.
func (g *Gateway) identify(ctx context.Context, c net.Conn) context.Context {
	ci := &connInfo{}
	switch nc := c.(type) {
	case *net.UnixConn:
		ci.caller = unixPeer(nc)
		if ci.caller.PID == 0 {
			ci.refusal = ReasonCallerUnknown
		}
	case *net.TCPConn:
		var members []int
		if g.cfg.Members != nil {
			members = g.cfg.Members()
		}
		caller, why := tcpPeer(nc, members)
		ci.caller, ci.refusal = caller, why
	default:
		ci.refusal = ReasonCallerUnknown
	}
	if ci.refusal == "" && ci.caller.UID != os.Geteuid() {
		ci.refusal = authority.ReasonOtherUser
	}
	return context.WithValue(ctx, connKey, ci)
}

func unixPeer(nc *net.UnixConn) Caller {
	var cred *unix.Ucred
	if rc, err := nc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		})
	}
	if cred == nil {
		return Caller{UID: -1}
	}
	c := Caller{PID: int(cred.Pid), UID: int(cred.Uid)}
	if st, err := proc.ReadStat(c.PID); err == nil && !st.Dead() {
		c.Start = st.Start
	}
	return c
}

// recheck returns a refusal unless the caller is still the process that
// connected (same start time, not a zombie).
func recheck(c Caller) string {
	// A caller whose start could not be read at connect time (0) is not
	// one process: proc.Alive would take any process at its PID for it.
	if c.Start == 0 || !proc.Alive(c.PID, c.Start) {
		return authority.ReasonCallerGone
	}
	return ""
}

// ServeHTTP checks, decides, and forwards one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	began := time.Now()
	ci, _ := r.Context().Value(connKey).(*connInfo)
	if ci == nil {
		ci = &connInfo{refusal: ReasonCallerUnknown}
	}
	req := Request{Gateway: g.spec.Name, Method: r.Method, Caller: ci.caller}
	raw := requestPath(r.RequestURI, r.URL)
	out, inside := "", false
	if raw != "" {
		out, inside = upstreamPath(g.spec.Prefix, raw)
	}
	if inside {
		req.Target = g.upstrHP + out
	} else {
		req.Target = g.upstrHP + " " + truncate(raw, 512)
	}
	switch {
	case ci.refusal != "":
		req.Refusal = ci.refusal
	case recheck(ci.caller) != "":
		req.Refusal = authority.ReasonCallerGone
	case r.Method == http.MethodConnect || r.Method == "PRI" || r.ProtoMajor != 1:
		req.Refusal = ReasonUpgrade
	case !g.spec.Allows(r.Method):
		req.Refusal = ReasonMethod
	case !inside:
		req.Refusal = ReasonOutside
	case r.Header.Get("Upgrade") != "" || r.Header.Get("Http2-Settings") != "" || headerHasToken(r.Header, "Connection", "upgrade"):
		req.Refusal = ReasonUpgrade
	}

	f := g.begin(r.Context())
	if f == nil {
		panic(http.ErrAbortHandler) // revoked: no answer at all
	}
	defer g.land(f)
	dec := g.cfg.Check(req)
	if !dec.Allow || req.Refusal != "" {
		g.refuse(w, dec)
		return
	}
	f.seq, f.outPath = dec.Seq, out
	if f.ctx.Err() != nil {
		panic(http.ErrAbortHandler) // revoked while being decided: never sent
	}
	cw := &countingWriter{ResponseWriter: w}
	var body *countingReader
	if r.Body != nil && r.Body != http.NoBody {
		body = &countingReader{ReadCloser: r.Body}
		r.Body = body
	}
	defer func() {
		p := recover()
		cw.end(p != nil)
		e := End{Seq: f.seq, Status: cw.status, BytesDown: cw.n, Duration: time.Since(began)}
		if body != nil {
			e.BytesUp = body.n
		}
		g.mu.Lock()
		e.Cut = f.cut
		g.mu.Unlock()
		if g.cfg.Ended != nil {
			g.cfg.Ended(e)
		}
		if p != nil {
			panic(p)
		}
	}()
	g.proxy.ServeHTTP(cw, r.WithContext(context.WithValue(f.ctx, flightKey, f)))
}

// begin registers a request in flight; nil once revoked.
func (g *Gateway) begin(parent context.Context) *flight {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.revoked {
		return nil
	}
	ctx, cancel := context.WithCancel(parent)
	f := &flight{ctx: ctx, cancel: cancel}
	g.flights[f] = struct{}{}
	g.wg.Add(1)
	return f
}

// land ends a flight; an accepted one in flight at Revoke is listed as cut.
func (g *Gateway) land(f *flight) {
	g.mu.Lock()
	delete(g.flights, f)
	if f.cut && f.seq != 0 {
		g.cut = append(g.cut, f.seq)
	}
	g.mu.Unlock()
	f.cancel()
	g.wg.Done()
}

// refusal is the one-line JSON body of a refusal: the decision and reason
// in authority's words, as journaled.
type refusal struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	RunID    string `json:"run_id"`
	Seq      int64  `json:"seq,omitempty"`
}

func (g *Gateway) refuse(w http.ResponseWriter, dec Decision) {
	b, _ := json.Marshal(refusal{Decision: authority.Refused, Reason: dec.Reason, RunID: g.cfg.RunID, Seq: dec.Seq})
	h := w.Header()
	h.Set(HeaderDecision, authority.Refused)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(http.StatusForbidden)
	w.Write(append(b, '\n'))
}

// rewrite points the outgoing request at the upstream, under its prefix,
// with the gateway's credential instead of the job's.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	f, _ := pr.In.Context().Value(flightKey).(*flight)
	out := pr.Out
	up := g.spec.Upstream
	out.URL.Scheme, out.URL.Host = up.Scheme, up.Host
	if f != nil {
		p, err := url.PathUnescape(f.outPath)
		if err != nil {
			p = f.outPath
		}
		out.URL.Path, out.URL.RawPath = p, f.outPath
	}
	out.URL.RawQuery = pr.In.URL.RawQuery
	out.Host = ""
	if g.header != "" {
		out.Header.Del(g.spec.Header)
		out.Header.Set(g.spec.Header, g.header)
	}
}

// modifyResponse rewrites a Location inside the prefix to the gateway's
// base, so a client that follows it stays behind the gateway; any other
// Location passes as it is (the gateway never follows one itself).
func (g *Gateway) modifyResponse(resp *http.Response) error {
	loc := resp.Header.Get("Location")
	if loc == "" || resp.Request == nil {
		return nil
	}
	u, err := resp.Request.URL.Parse(loc)
	if err != nil || u.Scheme != g.spec.Upstream.Scheme || !strings.EqualFold(u.Host, g.spec.Upstream.Host) {
		return nil
	}
	rest, ok := insidePrefix(g.spec.Prefix, u.EscapedPath())
	if !ok {
		return nil
	}
	if rest == "" {
		rest = "/"
	}
	n := g.base + rest
	if u.RawQuery != "" {
		n += "?" + u.RawQuery
	}
	if u.Fragment != "" {
		n += "#" + u.EscapedFragment()
	}
	resp.Header.Set("Location", n)
	return nil
}

// upstreamError answers a request the upstream could not take: 502, with
// the error (which names the upstream, never the credential). A request
// cut by revocation gets no answer at all.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		panic(http.ErrAbortHandler)
	}
	b, _ := json.Marshal(map[string]string{"decision": authority.Accepted, "error": "upstream: " + err.Error(), "run_id": g.cfg.RunID})
	w.Header().Set(HeaderDecision, authority.Accepted)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	w.Write(append(b, '\n'))
}

// upstreamDialer dials the upstream's TCP connections.
var upstreamDialer = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}

// readAhead is how much of an upstream connection's TLS stream one read(2)
// may take at once.
const readAhead = 128 << 10

// dialTLS opens a TLS connection to the upstream at addr, verified with
// conf for addr's host (what http.Transport does itself), over a TCP
// connection read through a buffer of readAhead bytes. crypto/tls reads
// from the socket about a record at a time; during a large download that
// was a read(2), and often a wait in the poller, for every 16 KiB. The
// handshake has 15 s.
func dialTLS(ctx context.Context, network, addr string, conf *tls.Config) (net.Conn, error) {
	raw, err := upstreamDialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := conf.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	}
	tc := tls.Client(&readAheadConn{Conn: raw, r: bufio.NewReaderSize(raw, readAhead)}, c)
	hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// readAheadConn is a connection whose reads go through r.
type readAheadConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readAheadConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// countingWriter is the job's side of a response: it counts the bytes
// that reach the job's connection (n) and gathers the body into writes of
// up to a copy buffer's size. The upstream's TLS records carry 16 KiB each;
// written one by one, a large download cost the job a wake-up and the
// wrapper a write(2) per record, which was most of the gateway's CPU. What
// is gathered goes out when the buffer is full, at the proxy's flush (at
// most flushEvery after the first byte of it; at once, write by write, for
// a streamed response: an event stream or a body of unknown length), and
// at the response's end.
type countingWriter struct {
	http.ResponseWriter
	status int
	n      int64
	buf    []byte // from copyBuffers while the response has one
	err    error  // the first write error, returned from then on
}

// flushEvery bounds how long a byte of a response of known length waits in
// the gateway before it is written to the job.
const flushEvery = 2 * time.Millisecond

func (c *countingWriter) WriteHeader(code int) {
	if code >= 200 && c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.err != nil {
		return 0, c.err
	}
	if c.buf == nil {
		c.buf = copyBuffers.Get()[:0]
	}
	if len(c.buf)+len(b) > cap(c.buf) {
		if err := c.drain(); err != nil {
			return 0, err
		}
		if len(b) >= cap(c.buf) {
			n, err := c.ResponseWriter.Write(b)
			c.n += int64(n)
			c.err = err
			return n, err
		}
	}
	c.buf = append(c.buf, b...)
	return len(b), nil
}

// drain writes what is gathered.
func (c *countingWriter) drain() error {
	if len(c.buf) == 0 || c.err != nil {
		return c.err
	}
	n, err := c.ResponseWriter.Write(c.buf)
	c.n += int64(n)
	c.buf, c.err = c.buf[:0], err
	return err
}

// FlushError writes what is gathered and flushes the job's connection.
func (c *countingWriter) FlushError() error {
	if err := c.drain(); err != nil {
		return err
	}
	return http.NewResponseController(c.ResponseWriter).Flush()
}

// end writes what is left, once the proxy is done with the response, and
// gives the buffer back. With abort (the proxy gave up on the response),
// what is left is dropped: the job's connection is being cut.
func (c *countingWriter) end(abort bool) {
	if c.buf == nil {
		return
	}
	if !abort {
		_ = c.drain()
	}
	copyBuffers.Put(c.buf[:cap(c.buf)])
	c.buf = nil
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

type countingReader struct {
	io.ReadCloser
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.ReadCloser.Read(b)
	c.n += int64(n)
	return n, err
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
