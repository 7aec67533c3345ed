package controller

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/httpgw"
	"github.com/agent-wrap/agent-wrap/ledger"
)

// loadedSpecs parses flags and loads them as agent-wrap ssh does, from a
// secret file of mode 0600 and the environment given.
func loadedSpecs(t *testing.T, f httpgw.Flags, env map[string]string) []*httpgw.Spec {
	t.Helper()
	specs, err := httpgw.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := httpgw.Load(specs, nil, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	return specs
}

// The launch's words name no secret, no local file and no variable; the
// stdin lines are the CA's base64 and then the secrets, in the order of
// the --http-secret words the launch gives (the gateways' order); the
// ledger gets names, upstreams and methods.
func TestHTTPLaunchRendersNoSecret(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "token")
	os.WriteFile(secretFile, []byte("s3cret-file-token\n"), 0o600)
	srv := httptest.NewTLSServer(nil)
	defer srv.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, caPEM, 0o644)

	specs := loadedSpecs(t, httpgw.Flags{
		HTTP:   []string{"gh=https://127.0.0.1:8443/api", "llm=https://models.example/v1", "open=https://example.org"},
		Secret: []string{"llm=env:LLM_TOKEN", "gh=file:" + secretFile},
		Allow:  []string{"llm=GET,POST"},
		CA:     []string{"gh=" + caFile},
	}, map[string]string{"LLM_TOKEN": "s3cret-env-token"})
	g, gws, err := newHTTPLaunch(specs)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(g.args, " ")
	for _, bad := range []string{"s3cret", secretFile, caFile, "LLM_TOKEN", "env:", "file:"} {
		if strings.Contains(line, bad) {
			t.Errorf("launch words hold %q: %s", bad, line)
		}
	}
	for _, want := range []string{"--http gh=https://127.0.0.1:8443/api", "--http-secret gh=stdin", "--http-secret llm=stdin", "--http-ca gh=stdin", "--http-allow llm=GET,POST", "--http open=https://example.org"} {
		if !strings.Contains(line, want) {
			t.Errorf("launch words lack %q: %s", want, line)
		}
	}
	if strings.Contains(line, "--http-secret open=") {
		t.Errorf("a policy-only gateway got a secret flag: %s", line)
	}
	stdin, forget := g.stdin()
	want := base64.StdEncoding.EncodeToString(caPEM) + "\n" + "s3cret-file-token\n" + "s3cret-env-token\n"
	if string(stdin) != want {
		t.Errorf("stdin lines:\n%q\nwant\n%q", stdin, want)
	}
	forget()
	if !bytes.Equal(stdin, make([]byte, len(stdin))) {
		t.Errorf("a launch's copy of the lines is not zeroed after the call")
	}
	if again, _ := g.stdin(); string(again) != want {
		t.Errorf("a second launch gets %q, want the lines again", again)
	}
	g.forget()
	if again, _ := g.stdin(); again != nil {
		t.Errorf("after forget a launch still gets %q", again)
	}

	wantGW := []ledger.HTTPGateway{
		{Name: "gh", Upstream: "https://127.0.0.1:8443/api", Methods: []string{"GET", "HEAD"}, Secret: true},
		{Name: "llm", Upstream: "https://models.example/v1", Methods: []string{"GET", "POST"}, Secret: true},
		{Name: "open", Upstream: "https://example.org", Methods: []string{"GET", "HEAD"}, Secret: false},
	}
	if !reflect.DeepEqual(gws, wantGW) {
		t.Errorf("ledger gateways %+v, want %+v", gws, wantGW)
	}
}

// A gateway whose secret was never loaded is refused: sent as it is, it
// would forward without the credential the user asked for.
func TestHTTPLaunchRefusesUnloaded(t *testing.T) {
	specs, err := httpgw.Parse(httpgw.Flags{HTTP: []string{"gh=https://example.org"}, Secret: []string{"gh=env:X"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := newHTTPLaunch(specs); err == nil || !strings.Contains(err.Error(), "gh") {
		t.Errorf("unloaded secret: err %v, want one naming the gateway", err)
	}
	if g, gws, err := newHTTPLaunch(nil); err != nil || gws != nil || g.args != nil {
		t.Errorf("no gateways: %+v %v %v", g, gws, err)
	}
}

func TestCheckRshStdin(t *testing.T) {
	for _, tc := range []struct {
		rsh []string
		ok  bool
	}{
		{[]string{"ssh"}, true},
		{[]string{"ssh", "-p", "2222", "-o", "BatchMode=yes"}, true},
		{[]string{"/usr/bin/ssh", "-i", "/k/-nkey"}, true},
		{[]string{"ssh", "-n"}, false},
		{[]string{"ssh", "-qn"}, false},
		{[]string{"ssh", "-f"}, false},
		{[]string{"ssh", "-o", "StdinNull=yes"}, false},
		{[]string{"mysh", "-n"}, true}, // not OpenSSH: its words are its own
	} {
		err := CheckRshStdin(tc.rsh)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrRshNoStdin) {
			t.Errorf("CheckRshStdin(%q) = %v, want ok %v", tc.rsh, err, tc.ok)
		}
	}
}
