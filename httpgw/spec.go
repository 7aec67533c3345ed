// Package httpgw is a run's HTTP credential gateway: a local HTTP endpoint
// (127.0.0.1 and a unix socket) that forwards a job's requests to one
// configured upstream, adding a credential the job never holds, for as long
// as the run is live and the caller is one of its processes.
//
// Guarantees of a Gateway:
//   - Every request is decided by the Check before anything is sent
//     upstream, one call per request: the caller (SO_PEERCRED on the unix
//     socket; on TCP the process holding the client end of the connection,
//     found at accept in the kernel's socket table and among the run's
//     processes' descriptors) has its start time re-checked each time. The
//     gateway's own refusals (caller_unknown, other_user, caller_gone,
//     method_not_allowed, outside_prefix, upgrade_refused) go to the Check
//     too, to be journaled.
//   - A request goes only to the configured origin, under its prefix: the
//     path is cleaned, and one that leaves the prefix (.., %2e%2e) or hides a
//     separator (%2f, %5c, a backslash) is refused; redirects are never
//     followed (the transport does not follow them) and a Location inside
//     the prefix is rewritten to the gateway's own base. TLS is verified
//     against the system roots or the configured ones; there is no way to
//     turn that off. Proxy variables of the environment are ignored.
//   - The job's own value of the credential header is dropped; the
//     gateway's is added. The secret is in no error, response or journal
//     field the gateway produces.
//   - Revoke closes both listeners, removes the socket, aborts every client
//     connection and every request in flight (their upstream connections
//     with them) and, once every handler has returned, reports the accepted
//     requests that were cut. After it returns, a client gets no HTTP
//     answer at all.
//
// Not guaranteed: a response body the job already read, or a token an
// upstream hands back in a body, is the job's; the gateway cannot take it
// back.
package httpgw

import (
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
)

// DefaultHeader is the credential header template when none is given.
const DefaultHeader = "Authorization: Bearer {secret}"

// The default template's parts, as parseTemplate splits it.
const (
	defaultHeaderName = "Authorization"
	defaultTemplate   = "Bearer {secret}"
)

// DefaultMethods are the methods a gateway forwards when none are given:
// read-only.
var DefaultMethods = []string{"GET", "HEAD"}

// Placeholders of a header template.
const (
	PlaceholderSecret = "{secret}"
	PlaceholderBasic  = "{basic}" // base64 of a user:token secret
)

// Secret sources.
const (
	SourceFile  = "file"
	SourceEnv   = "env"
	SourceStdin = "stdin"
	SourceNone  = "none" // a policy-only gateway
)

// validName reports whether a gateway's NAME matches [a-z][a-z0-9-]{0,31}.
// (A loop, not a regexp: a package-level regexp is compiled at every start
// of the binary, whether a gateway is asked for or not.)
func validName(name string) bool {
	if len(name) == 0 || len(name) > 32 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Spec is one gateway, as the command line describes it.
type Spec struct {
	Name     string
	Upstream *url.URL // scheme, host and prefix (no trailing slash); nothing else
	Prefix   string   // the upstream path prefix, "" or "/a/b"
	Header   string   // the credential header's canonical name
	Template string   // its value, with one placeholder
	Methods  []string // forwarded methods, upper case
	CAFile   string   // extra PEM roots, or ""
	CAPEM    []byte   // their content, once loaded
	Source   string   // SourceFile, SourceEnv, SourceStdin or SourceNone
	Where    string   // the file's path or the variable's name

	secret []byte
	// secretFlag and caFlag are the positions of the gateway's
	// --http-secret and --http-ca among those flags: stdin lines are read
	// in flag order.
	secretFlag, caFlag int
}

// caStdin as a --http-ca value: one line on stdin, the PEM in
// standard base64 (how `agent-wrap ssh` sends a CA file it read on the
// controller).
const caStdin = "stdin"

// UsageError is a gateway flag that is wrong as written: exit 64.
type UsageError struct{ Msg, Hint string }

func (e *UsageError) Error() string { return e.Msg }

// InputError is a secret or CA file that is missing, unreadable, unsafe or
// empty: exit 66. Its message never holds the secret.
type InputError struct{ Msg, Hint string }

func (e *InputError) Error() string { return e.Msg }

func usage(hint, format string, a ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, a...), Hint: hint}
}

func input(hint, format string, a ...any) error {
	return &InputError{Msg: fmt.Sprintf(format, a...), Hint: hint}
}

// Flags are the raw values of the repeatable --http* flags, in order.
type Flags struct {
	HTTP, Secret, Header, Allow, CA []string
}

// Empty reports whether no gateway flag was given.
func (f Flags) Empty() bool {
	return len(f.HTTP)+len(f.Secret)+len(f.Header)+len(f.Allow)+len(f.CA) == 0
}

// Args renders the flags as command-line words again (for --detach and the
// controller's launch), in the same order. It holds no secret: a source is
// a path, a variable's name or "stdin".
func (f Flags) Args() []string {
	var out []string
	add := func(flag string, vals []string) {
		for _, v := range vals {
			out = append(out, flag, v)
		}
	}
	add("--http", f.HTTP)
	add("--http-secret", f.Secret)
	add("--http-header", f.Header)
	add("--http-allow", f.Allow)
	add("--http-ca", f.CA)
	return out
}

// Parse checks the flags and returns one Spec per --http, in order. It reads
// no file: every error is a UsageError.
func Parse(f Flags) ([]*Spec, error) {
	var specs []*Spec
	byName := map[string]*Spec{}
	for _, v := range f.HTTP {
		name, raw, ok := strings.Cut(v, "=")
		if !ok {
			return nil, usage("write it as --http NAME=https://HOST[:PORT][/PREFIX]", "--http %q has no NAME=", v)
		}
		if !validName(name) {
			return nil, usage("a gateway NAME is a lower-case letter, then up to 31 lower-case letters, digits or '-'", "--http: %q is not a gateway name", name)
		}
		if byName[name] != nil {
			return nil, usage("give each gateway its own NAME", "--http %s is given twice", name)
		}
		u, prefix, err := parseUpstream(raw)
		if err != nil {
			return nil, usage("the upstream is https://HOST[:PORT][/PREFIX]; http:// only for 127.0.0.0/8, ::1 or localhost; no user, query or fragment", "--http %s: %v", name, err)
		}
		s := &Spec{Name: name, Upstream: u, Prefix: prefix, Methods: DefaultMethods, Source: SourceNone,
			Header: defaultHeaderName, Template: defaultTemplate}
		byName[name] = s
		specs = append(specs, s)
	}
	var pos int
	each := func(flag string, vals []string, set func(*Spec, string) error) error {
		seen := map[string]bool{}
		for i, v := range vals {
			pos = i
			name, val, ok := strings.Cut(v, "=")
			if !ok {
				return usage(fmt.Sprintf("write it as %s NAME=VALUE, NAME one of the --http gateways", flag), "%s %q has no NAME=", flag, v)
			}
			s := byName[name]
			if s == nil {
				return usage(fmt.Sprintf("declare the gateway first: --http %s=https://HOST/PREFIX", name), "%s %s: no --http %s", flag, name, name)
			}
			if seen[name] {
				return usage("give it once per gateway", "%s %s is given twice", flag, name)
			}
			seen[name] = true
			if err := set(s, val); err != nil {
				return err
			}
		}
		return nil
	}
	err := each("--http-secret", f.Secret, func(s *Spec, v string) error {
		kind, where, _ := strings.Cut(v, ":")
		s.secretFlag = pos
		switch {
		case kind == SourceFile && where != "":
			s.Source, s.Where = SourceFile, where
		case kind == SourceEnv && where != "":
			s.Source, s.Where = SourceEnv, where
		case v == SourceStdin:
			s.Source = SourceStdin
		default:
			return usage("a secret comes from file:PATH, env:VAR or stdin", "--http-secret %s: %q is not a source", s.Name, v)
		}
		return nil
	})
	if err == nil {
		err = each("--http-header", f.Header, func(s *Spec, v string) error {
			h, t, err := parseTemplate(v)
			if err != nil {
				return usage(`a template is "Header-Name: value", the value holding {secret} or {basic} exactly once`, "--http-header %s: %v", s.Name, err)
			}
			s.Header, s.Template = h, t
			return nil
		})
	}
	if err == nil {
		err = each("--http-allow", f.Allow, func(s *Spec, v string) error {
			m, err := parseMethods(v)
			if err != nil {
				return usage("methods are comma-separated (GET,HEAD,POST), or * for every method but CONNECT and TRACE", "--http-allow %s: %v", s.Name, err)
			}
			s.Methods = m
			return nil
		})
	}
	if err == nil {
		err = each("--http-ca", f.CA, func(s *Spec, v string) error {
			if v == "" {
				return usage("name a PEM file of CA certificates", "--http-ca %s: no file", s.Name)
			}
			s.CAFile, s.caFlag = v, pos
			return nil
		})
	}
	if err != nil {
		return nil, err
	}
	return specs, nil
}

// parseUpstream checks an upstream URL and returns it without a trailing
// slash, with its path prefix.
func parseUpstream(raw string) (*url.URL, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url's error quotes the whole value, which may hold a password.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, "", fmt.Errorf("not a URL: %v", err)
	}
	// Messages show the URL with any password masked.
	hash := strings.Contains(raw, "#")
	raw = u.Redacted()
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, "", fmt.Errorf("%q: the scheme must be https", raw)
	case u.User != nil:
		return nil, "", fmt.Errorf("%q holds a user name or password: give the credential with --http-secret", raw)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, "", fmt.Errorf("%q has a query string", raw)
	case u.Fragment != "" || hash:
		return nil, "", fmt.Errorf("%q has a fragment", raw)
	case u.Opaque != "" || u.Hostname() == "":
		return nil, "", fmt.Errorf("%q names no host", raw)
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return nil, "", fmt.Errorf("%q: plain http is only for a loopback host; the credential would cross the network in the clear", raw)
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 {
			return nil, "", fmt.Errorf("%q: port %q", raw, p)
		}
	}
	prefix := strings.TrimRight(u.EscapedPath(), "/")
	if prefix != "" {
		segs, ok := cleanSegments(prefix)
		if !ok || "/"+strings.Join(segs, "/") != prefix {
			return nil, "", fmt.Errorf("%q: the prefix must be a plain path (no '.', '..', '//' or encoded separators)", raw)
		}
	}
	out := &url.URL{Scheme: u.Scheme, Host: u.Host}
	return out, prefix, nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// parseTemplate splits "Name: value" and checks it.
func parseTemplate(t string) (header, value string, err error) {
	name, val, ok := strings.Cut(t, ":")
	if !ok {
		return "", "", fmt.Errorf("%q has no ':' between the header name and its value", t)
	}
	if name == "" || strings.IndexFunc(name, func(r rune) bool { return !tokenChar(r) }) >= 0 {
		return "", "", fmt.Errorf("%q is not a header name", name)
	}
	val = strings.TrimSpace(val)
	if n := strings.Count(val, PlaceholderSecret) + strings.Count(val, PlaceholderBasic); n != 1 {
		return "", "", fmt.Errorf("the value holds %d placeholders, not exactly one of {secret} or {basic}", n)
	}
	if strings.ContainsFunc(val, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", "", errors.New("the value holds a control character")
	}
	return canonicalHeader(name), val, nil
}

// tokenChar is RFC 9110's tchar.
func tokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// canonicalHeader is textproto's canonical form (net/textproto is not
// imported here for one function).
func canonicalHeader(s string) string {
	b := []byte(s)
	upper := true
	for i, c := range b {
		if upper && c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		} else if !upper && c >= 'A' && c <= 'Z' {
			b[i] = c - 'A' + 'a'
		}
		upper = c == '-'
	}
	return string(b)
}

// everyMethod is what "*" allows: every method but CONNECT and TRACE.
var everyMethod = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "*"}

func parseMethods(v string) ([]string, error) {
	if v == "*" {
		return everyMethod, nil
	}
	var out []string
	for _, m := range strings.Split(v, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		switch {
		case m == "":
			return nil, fmt.Errorf("%q has an empty method", v)
		case m == "CONNECT" || m == "TRACE":
			return nil, fmt.Errorf("%s is never forwarded", m)
		case strings.IndexFunc(m, func(r rune) bool { return !tokenChar(r) }) >= 0:
			return nil, fmt.Errorf("%q is not a method", m)
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// Allows reports whether the gateway forwards method.
func (s *Spec) Allows(method string) bool {
	if method == "CONNECT" || method == "TRACE" {
		return false
	}
	if slices.Contains(s.Methods, "*") {
		return true
	}
	return slices.Contains(s.Methods, method)
}

// MethodList is the methods as status.json and the journal show them.
func (s *Spec) MethodList() []string {
	if slices.Contains(s.Methods, "*") {
		return []string{"*"}
	}
	return s.Methods
}

// UpstreamString is the upstream URL with its prefix, without any secret
// (the URL never holds one: Parse refuses userinfo).
func (s *Spec) UpstreamString() string { return s.Upstream.String() + s.Prefix }

// EnvName is the job's variable for the gateway's base URL:
// AGENT_WRAP_HTTP_<NAME>, upper case, '-' as '_'.
func (s *Spec) EnvName() string {
	return "AGENT_WRAP_HTTP_" + strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
}

// HasSecret reports whether a secret is loaded.
func (s *Spec) HasSecret() bool { return len(s.secret) > 0 }

// SetSecret gives the gateway its secret (what Load reads). The slice is
// kept, not copied.
func (s *Spec) SetSecret(b []byte) error {
	if err := checkSecret(s, b); err != nil {
		return err
	}
	s.secret = b
	return nil
}

// headerValue renders the credential header's value.
func (s *Spec) headerValue() string {
	if strings.Contains(s.Template, PlaceholderBasic) {
		return strings.Replace(s.Template, PlaceholderBasic, base64.StdEncoding.EncodeToString(s.secret), 1)
	}
	return strings.Replace(s.Template, PlaceholderSecret, string(s.secret), 1)
}

// Load reads every secret and CA file: file:PATH (refused when group or
// others may read it), env:VAR (from getenv), stdin. Stdin is read one byte
// at a time, so what follows the lines is the job's: first one line per
// --http-ca NAME=stdin (the PEM in standard base64), in the order of the
// --http-ca flags, then one line per --http-secret NAME=stdin, in the order
// of the --http-secret flags. Every error is an InputError and names the
// gateway and the source, never the secret.
func Load(specs []*Spec, stdin io.Reader, getenv func(string) string) error {
	for _, s := range specs {
		if s.CAFile == "" || s.CAFile == caStdin {
			continue
		}
		b, err := os.ReadFile(s.CAFile)
		if err != nil {
			return input("name a readable PEM file of CA certificates", "--http-ca %s: %v", s.Name, err)
		}
		if err := s.SetCA(b); err != nil {
			return err
		}
	}
	for _, s := range inFlagOrder(specs, func(s *Spec) (bool, int) { return s.CAFile == caStdin, s.caFlag }) {
		line, err := readLine(stdin)
		if err == nil {
			line, err = base64.StdEncoding.DecodeString(string(trimNewline(line)))
		}
		if err != nil {
			return input("give the CA as one line of base64 on stdin, before the secrets' lines", "--http-ca %s=stdin: %v", s.Name, err)
		}
		if err := s.SetCA(line); err != nil {
			return err
		}
	}
	for _, s := range specs {
		var b []byte
		switch s.Source {
		case SourceFile:
			var err error
			b, err = readSecretFile(s.Where)
			if err != nil {
				return input(fmt.Sprintf("chmod 600 %s (as ssh wants of a key), and give the job a URL, not the file", s.Where), "--http-secret %s=file:%s: %v", s.Name, s.Where, err)
			}
		case SourceEnv:
			b = []byte(getenv(s.Where))
			if len(b) == 0 {
				return input(fmt.Sprintf("export %s in the environment agent-wrap runs in", s.Where), "--http-secret %s=env:%s: the variable is not set or empty", s.Name, s.Where)
			}
		default:
			continue
		}
		if err := s.SetSecret(trimNewline(b)); err != nil {
			return err
		}
	}
	for _, s := range inFlagOrder(specs, func(s *Spec) (bool, int) { return s.Source == SourceStdin, s.secretFlag }) {
		line, err := readLine(stdin)
		if err != nil {
			return input("give one line on stdin per stdin secret, in the order of the --http-secret flags", "--http-secret %s=stdin: %v", s.Name, err)
		}
		if err := s.SetSecret(trimNewline(line)); err != nil {
			return err
		}
	}
	return nil
}

// inFlagOrder is the specs that pick chooses, ordered by the position it
// gives.
func inFlagOrder(specs []*Spec, pick func(*Spec) (bool, int)) []*Spec {
	var out []*Spec
	for _, s := range specs {
		if ok, _ := pick(s); ok {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b *Spec) int {
		_, i := pick(a)
		_, j := pick(b)
		return i - j
	})
	return out
}

// Remote renders loaded specs as the flags of a `run` on another host that
// takes every secret and CA from stdin, and those stdin lines (the CAs',
// then the secrets', each in the order of the flags given here). What
// `agent-wrap ssh` sends: the flags name no local file or variable, and
// the secrets travel only in the returned bytes, which the caller writes
// to the launch connection's stdin and then forgets.
func Remote(specs []*Spec) (args []string, stdin []byte) {
	var cas, secrets []byte
	for _, s := range specs {
		args = append(args, "--http", s.Name+"="+s.UpstreamString())
		if s.Template != defaultTemplate || s.Header != defaultHeaderName {
			args = append(args, "--http-header", s.Name+"="+s.Header+": "+s.Template)
		}
		if !slices.Equal(s.Methods, DefaultMethods) {
			args = append(args, "--http-allow", s.Name+"="+strings.Join(s.MethodList(), ","))
		}
	}
	for _, s := range specs {
		if len(s.CAPEM) > 0 {
			args = append(args, "--http-ca", s.Name+"="+caStdin)
			cas = append(cas, base64.StdEncoding.EncodeToString(s.CAPEM)...)
			cas = append(cas, '\n')
		}
	}
	for _, s := range specs {
		if s.HasSecret() {
			args = append(args, "--http-secret", s.Name+"="+SourceStdin)
			secrets = append(secrets, s.secret...)
			secrets = append(secrets, '\n')
		}
	}
	return args, append(cas, secrets...)
}

// Passed is the stdin Remote would send for loaded specs, in the order
// LoadPassed reads it: what `run --detach` hands its supervisor on a pipe,
// so the supervisor, started with the same flags, never reads a file or a
// variable again.
func Passed(specs []*Spec) []byte {
	_, b := Remote(specs)
	return b
}

// LoadPassed loads specs from Passed's bytes on r: a CA line for each spec
// with --http-ca, then a secret line for each with --http-secret, in spec
// order. The specs keep their sources, as the journal names them.
func LoadPassed(specs []*Spec, r io.Reader) error {
	for _, s := range specs {
		if s.CAFile == "" {
			continue
		}
		line, err := readLine(r)
		if err == nil {
			line, err = base64.StdEncoding.DecodeString(string(line))
		}
		if err != nil {
			return input("", "--http-ca %s: from the caller: %v", s.Name, err)
		}
		if err := s.SetCA(line); err != nil {
			return err
		}
	}
	for _, s := range specs {
		if s.Source == SourceNone {
			continue
		}
		line, err := readLine(r)
		if err != nil {
			return input("", "--http-secret %s: from the caller: %v", s.Name, err)
		}
		if err := s.SetSecret(line); err != nil {
			return err
		}
	}
	return nil
}

// Secrets lists each loaded secret's bytes, for a caller that must hand
// them to another process of its own (run --detach to its supervisor) and
// for tests that search files for them. Never print or store them.
func Secrets(specs []*Spec) map[string][]byte {
	out := map[string][]byte{}
	for _, s := range specs {
		if s.HasSecret() {
			out[s.Name] = s.secret
		}
	}
	return out
}

// SetCA gives the gateway extra PEM roots.
func (s *Spec) SetCA(pem []byte) error {
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return input("the file must hold PEM CERTIFICATE blocks", "--http-ca %s: no certificate in %s", s.Name, s.CAFile)
	}
	s.CAPEM = pem
	return nil
}

// EnvVars lists the variables env: secrets are taken from, which the job's
// environment must not have.
func EnvVars(specs []*Spec) []string {
	var out []string
	for _, s := range specs {
		if s.Source == SourceEnv {
			out = append(out, s.Where)
		}
	}
	return out
}

func checkSecret(s *Spec, b []byte) error {
	src := s.Source
	if s.Where != "" {
		src += ":" + s.Where
	}
	if len(b) == 0 {
		return input("the secret must not be empty", "--http-secret %s=%s: the secret is empty", s.Name, src)
	}
	for _, c := range b {
		if c < 0x20 || c == 0x7f {
			return input("a secret is one line of printable text", "--http-secret %s=%s: the secret holds a control character or a line break", s.Name, src)
		}
	}
	if strings.Contains(s.Template, PlaceholderBasic) && !strings.Contains(string(b), ":") {
		return input("{basic} takes a secret of the form user:token", "--http-secret %s=%s: the template uses {basic} but the secret has no ':'", s.Name, src)
	}
	return nil
}

// readSecretFile reads a secret file that only its owner may read.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("mode %04o: readable by group or others", st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 64<<10 {
		return nil, errors.New("larger than 64 KiB: not a secret")
	}
	return b, nil
}

// readLine reads one line, a byte at a time (no read-ahead: the rest of
// the stream stays unread).
func readLine(r io.Reader) ([]byte, error) {
	if r == nil {
		return nil, errors.New("no stdin")
	}
	var line []byte
	var b [1]byte
	for len(line) <= 64<<10 {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return line, nil
			}
			line = append(line, b[0])
			continue
		}
		if err == io.EOF {
			if len(line) == 0 {
				return nil, errors.New("stdin ended before the secret's line")
			}
			return line, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, errors.New("the line is longer than 64 KiB: not a secret")
}

func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}
