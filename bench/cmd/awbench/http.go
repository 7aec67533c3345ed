package main

// The http figure: what a run's HTTP credential gateway costs, against the
// same requests sent directly to the same upstream.
//   - latency: a small GET over one keep-alive connection each, from one
//     process inside the run, alternating the gateway (plain HTTP to the
//     wrapper, which checks, journals with an fsync, adds the token and
//     forwards over its own keep-alive TLS connection) and the upstream
//     directly (TLS from the job). Target: the median added latency at most
//     1 ms plus the journal's fsync, which is measured apart (a synced
//     journal line in a run directory of the same root).
//   - throughput: a 256 MiB download through the gateway against the same
//     download directly, alternating (target: at least 0.8× direct).
//   - memory: the wrapper's RSS with one gateway listening and idle,
//     against the same run without one.
// The upstream is a TLS server in this process (its certificate the
// gateway's --http-ca); it counts the gateway's requests that carried the
// token, so the figure is known to measure requests that were forwarded.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/agent-wrap/agent-wrap/bench"
	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// httpBigBytes is the download's size.
const httpBigBytes = 256 << 20

// httpUpstream is the figure's TLS upstream.
type httpUpstream struct {
	srv    *httptest.Server
	caFile string
	token  string
	authed atomic.Int64 // requests that carried "Bearer token"
}

func (r *runner) startHTTPUpstream() (*httpUpstream, error) {
	b := make([]byte, 16)
	rand.Read(b)
	u := &httpUpstream{token: "awbench-" + hex.EncodeToString(b)}
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") == "Bearer "+u.token {
			u.authed.Add(1)
		}
		switch req.URL.Path {
		case "/api/small":
			w.Header().Set("Content-Length", "2")
			w.Write([]byte("ok"))
		case "/api/big":
			n, _ := strconv.Atoi(req.URL.Query().Get("bytes"))
			w.Header().Set("Content-Length", strconv.Itoa(n))
			for n > 0 {
				k := min(n, len(chunk))
				if _, err := w.Write(chunk[:k]); err != nil {
					return
				}
				n -= k
			}
		default:
			http.NotFound(w, req)
		}
	}))
	u.srv.StartTLS()
	r.onCleanup(u.srv.Close)
	u.caFile = filepath.Join(r.scratch, "http-ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
	if err := os.WriteFile(u.caFile, ca, 0o644); err != nil {
		return nil, err
	}
	return u, nil
}

// httpArgs are the run flags of one gateway named bench to u, its secret
// in a file of mode 0600.
func (r *runner) httpArgs(u *httpUpstream) ([]string, error) {
	secret := filepath.Join(r.scratch, "http-token")
	if err := os.WriteFile(secret, []byte(u.token+"\n"), 0o600); err != nil {
		return nil, err
	}
	return []string{"--http", "bench=" + u.srv.URL + "/api", "--http-secret", "bench=file:" + secret, "--http-ca", "bench=" + u.caFile}, nil
}

// httpSamples is what `awbench httploop` prints: seconds per request.
type httpSamples struct {
	Direct, Gateway        []float64 // the small GET
	BigDirect, BigGateway  []float64 // the download
	BigBare                []float64 // the download through a bare httputil.ReverseProxy (a reference)
	GatewayCount, BigCount int       // requests sent through the gateway
	ReusedDirect, ReusedGW int       // small GETs on a reused connection
	BigBytes               int64
}

func (r *runner) httpFigure() error {
	u, err := r.startHTTPUpstream()
	if err != nil {
		return err
	}
	gw, err := r.httpArgs(u)
	if err != nil {
		return err
	}
	root, err := r.newRoot("http")
	if err != nil {
		return err
	}
	n, big := r.n(400, 100), r.n(5, 3)
	id := r.id("http")
	args := append([]string{"--root", root, "run", "--no-stream", "--lease", "10m"}, gw...)
	args = append(args, id, "--", r.self, "httploop", strconv.Itoa(n), strconv.Itoa(big))
	cmd := exec.Command(r.bin, args...)
	bare, err := r.bareProxy(u)
	if err != nil {
		return err
	}
	cmd.Env = append(os.Environ(), "AWBENCH_UPSTREAM="+u.srv.URL+"/api", "AWBENCH_CA="+u.caFile, "AWBENCH_BARE="+bare+"/api")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("httploop run: %v: %s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(root, id, "stdout.log"))
	if err != nil {
		return err
	}
	var s httpSamples
	if err := json.Unmarshal(b, &s); err != nil {
		stderr, _ := os.ReadFile(filepath.Join(root, id, "stderr.log"))
		return fmt.Errorf("httploop: %v: %s %s", err, b, stderr)
	}
	if got := u.authed.Load(); got != int64(s.GatewayCount+s.BigCount) {
		return fmt.Errorf("the upstream saw %d requests with the token, the job sent %d through the gateway", got, s.GatewayCount+s.BigCount)
	}
	fsync, err := r.journalFsync(root)
	if err != nil {
		return err
	}

	d, g := bench.Median(s.Direct), bench.Median(s.Gateway)
	added := g - d
	limit := 0.001 + fsync
	r.rows = append(r.rows, row{
		figure:   "HTTP gateway, added latency of a small keep-alive GET",
		measured: bench.Ms(added) + " (" + bench.Ms(g) + " through it)",
		baseline: bench.Ms(d) + " (the TLS upstream directly)",
		ratio:    fmt.Sprintf("%.1f×", g/d),
		target:   fmt.Sprintf("≤ 1 ms + the journal's fsync (%s)", bench.Ms(fsync)),
		limit:    fmt.Sprintf("%.2f", added/limit),
		pass:     passIf(added <= limit),
	})
	r.detail("http latency, GET of 2 bytes, one keep-alive connection each (reused: direct %d/%d, gateway %d/%d), alternating, from a process of the run: gateway %s; direct %s. Each request through the gateway is decided under the run's lock (caller found by its TCP connection, re-checked), journaled with an fsync before it goes upstream, and its end journaled after",
		s.ReusedDirect, len(s.Direct), s.ReusedGW, len(s.Gateway), spread(s.Gateway, bench.Ms), spread(s.Direct, bench.Ms))
	r.detail("http journal fsync (a synced journal line in a run directory of the same root, measured apart): %s", bench.Ms(fsync))

	bd, bg := bench.Median(s.BigDirect), bench.Median(s.BigGateway)
	ratio := bd / bg
	mibps := func(sec float64) string { return fmt.Sprintf("%.0f MiB/s", float64(s.BigBytes)/mib/sec) }
	r.rows = append(r.rows, row{
		figure:   fmt.Sprintf("HTTP gateway, %s download", humanBytes(s.BigBytes)),
		measured: mibps(bg) + " (" + bench.Ms(bg) + ")",
		baseline: mibps(bd) + " (directly)",
		ratio:    fmt.Sprintf("%.2f× direct", ratio),
		target:   "≥ 0.8× direct",
		limit:    fmt.Sprintf("%.2f", 0.8/ratio),
		pass:     passIf(ratio >= 0.8),
	})
	r.detail("http download of %s, alternating, read to the end by the job: gateway %s; direct %s; reference, not a target: through a bare httputil.ReverseProxy in awbench's process (no checks, no journal, the same upstream TLS) %s, %.2f× direct",
		humanBytes(s.BigBytes), spread(s.BigGateway, bench.Ms), spread(s.BigDirect, bench.Ms), spread(s.BigBare, bench.Ms), bd/bench.Median(s.BigBare))
	return r.httpIdleRSS(root, gw)
}

// bareProxy starts a plain httputil.ReverseProxy to u on 127.0.0.1 in this
// process, verifying u's certificate as the gateway does: the reference
// for what one proxy hop costs on this machine.
func (r *runner) bareProxy(u *httpUpstream) (string, error) {
	target, err := url.Parse(u.srv.URL)
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	pool.AddCert(u.srv.Certificate())
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool}, DisableCompression: true}
	srv := httptest.NewServer(rp)
	r.onCleanup(srv.Close)
	return srv.URL, nil
}

// journalFsync is the median time of a synced journal line in a run
// directory of root.
func (r *runner) journalFsync(rootPath string) (float64, error) {
	root, err := rundir.OpenRoot(rootPath, false)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	d, err := root.Create(r.id("http-fsync"))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	s, err := bench.Interleave(3, r.n(60, 20), func() (float64, error) {
		t0 := bench.Now()
		_, err := journal.Append(d, "action", journal.Fields{"channel": "http:bench", "request": "GET", "target": "127.0.0.1/api/small"}, true)
		return bench.Since(t0), err
	})
	if err != nil {
		return 0, err
	}
	return bench.Median(s[0]), nil
}

// httpIdleRSS: the wrapper's VmRSS with one gateway listening, idle,
// against the same run without a gateway, once each is running.
func (r *runner) httpIdleRSS(root string, gw []string) error {
	rss := func(flags []string) (int64, error) {
		id := r.id("http-rss")
		args := append([]string{r.bin, "--root", root, "run", "--no-stream", "--lease", "5m"}, flags...)
		w, err := r.start(nil, nil, false, append(args, id, "--", "sleep", "300")...)
		if err != nil {
			return 0, err
		}
		defer r.stopRun(root, id, w)
		if _, err := waitRunning(root, id, w.pid, nil); err != nil {
			return 0, err
		}
		if len(flags) > 0 {
			if rec, err := readRecord(root, id); err != nil || len(rec.HTTP) != 1 {
				return 0, fmt.Errorf("run %s: the gateway is not in status.json (%v)", id, err)
			}
		}
		// Let the start's garbage settle, as a run idles.
		time.Sleep(200 * time.Millisecond)
		return bench.StatusBytes(w.pid, "VmRSS")
	}
	var with, without []float64
	for i := 0; i < r.n(3, 2); i++ {
		a, err := rss(gw)
		if err != nil {
			return err
		}
		b, err := rss(nil)
		if err != nil {
			return err
		}
		with, without = append(with, float64(a)), append(without, float64(b))
	}
	a, b := bench.Median(with), bench.Median(without)
	mb := func(x float64) string { return fmt.Sprintf("%.1f MiB", x/mib) }
	r.rows = append(r.rows, row{
		figure:   "HTTP gateway, wrapper RSS with one gateway idle",
		measured: mb(a), baseline: mb(b) + " (the same run without one)",
		ratio:  fmt.Sprintf("+%s", mb(a-b)),
		target: "reported", limit: "-", pass: "n/a",
	})
	r.detail("http idle wrapper VmRSS, job sleep 300, read once running: with one gateway %v bytes; without %v bytes", with, without)
	return nil
}

// httploop runs inside a run: n small GETs through $AGENT_WRAP_HTTP_BENCH
// and n directly to $AWBENCH_UPSTREAM (TLS, roots $AWBENCH_CA),
// alternating, each on one keep-alive connection; then big downloads of
// httpBigBytes each way, alternating. It prints the samples as JSON.
func httploop(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: awbench httploop N BIG")
		return 64
	}
	n, err1 := strconv.Atoi(args[0])
	big, err2 := strconv.Atoi(args[1])
	base, direct, bare := os.Getenv("AGENT_WRAP_HTTP_BENCH"), os.Getenv("AWBENCH_UPSTREAM"), os.Getenv("AWBENCH_BARE")
	if err := errors.Join(err1, err2); err != nil || base == "" || direct == "" || bare == "" {
		fmt.Fprintf(stderr, "awbench httploop: want N BIG, $AGENT_WRAP_HTTP_BENCH, $AWBENCH_UPSTREAM and $AWBENCH_BARE (%v)\n", err)
		return 64
	}
	ca, err := os.ReadFile(os.Getenv("AWBENCH_CA"))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	// One connection each, kept alive; no proxy from the environment.
	client := func(tc *tls.Config) *http.Client {
		return &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: tc, MaxIdleConnsPerHost: 1,
			DisableCompression: true, IdleConnTimeout: time.Minute}}
	}
	dc, gc, bc := client(&tls.Config{RootCAs: pool}), client(nil), client(nil)
	var s httpSamples
	get := func(c *http.Client, url string, reused *int, count *int) (float64, int64, error) {
		t0 := time.Now()
		req, _ := http.NewRequest("GET", url, nil)
		var wasReused bool
		req = req.WithContext(withReuse(req.Context(), &wasReused))
		resp, err := c.Do(req)
		if err != nil {
			return 0, 0, err
		}
		nb, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		if count != nil {
			*count++
		}
		if wasReused && reused != nil {
			*reused++
		}
		return time.Since(t0).Seconds(), nb, err
	}
	// Reuse is counted over the samples, not the warm-up rounds.
	const warmup = 10
	var callsD, callsG int
	small, err := bench.Interleave(warmup, n,
		func() (float64, error) {
			var reused *int
			if callsD++; callsD > warmup {
				reused = &s.ReusedDirect
			}
			d, _, err := get(dc, direct+"/small", reused, nil)
			return d, err
		},
		func() (float64, error) {
			var reused *int
			if callsG++; callsG > warmup {
				reused = &s.ReusedGW
			}
			d, _, err := get(gc, base+"/small", reused, &s.GatewayCount)
			return d, err
		})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	s.Direct, s.Gateway = small[0], small[1]
	q := "/big?bytes=" + strconv.Itoa(httpBigBytes)
	bigs, err := bench.Interleave(1, big,
		func() (float64, error) {
			d, nb, err := get(dc, direct+q, nil, nil)
			s.BigBytes = nb
			return d, err
		},
		func() (float64, error) {
			d, nb, err := get(gc, base+q, nil, &s.BigCount)
			if err == nil && nb != httpBigBytes {
				err = fmt.Errorf("the gateway's download ended at %d bytes", nb)
			}
			return d, err
		},
		func() (float64, error) {
			d, _, err := get(bc, bare+q, nil, nil)
			return d, err
		})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	s.BigDirect, s.BigGateway, s.BigBare = bigs[0], bigs[1], bigs[2]
	_ = json.NewEncoder(stdout).Encode(s)
	return 0
}

// withReuse returns ctx that records in *reused whether the request went
// over a connection already open.
func withReuse(ctx context.Context, reused *bool) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { *reused = i.Reused },
	})
}
