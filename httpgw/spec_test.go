package httpgw

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every gateway flag that is wrong as written is a UsageError (64), and
// none of the messages repeats a password given in a URL.
func TestParseRefuses(t *testing.T) {
	for _, f := range []Flags{
		{HTTP: []string{"gh"}},
		{HTTP: []string{"-gh=https://h"}},
		{HTTP: []string{"a" + strings.Repeat("b", 32) + "=https://h"}},
		{HTTP: []string{"gh=https://h", "gh=https://i"}},
		{HTTP: []string{"gh=ftp://h"}},
		{HTTP: []string{"gh=http://10.0.0.1"}},
		{HTTP: []string{"gh=https://user:hunter2@h"}},
		{HTTP: []string{"gh=https://h/a?b"}},
		{HTTP: []string{"gh=https://h/a?"}},
		{HTTP: []string{"gh=https://h/a#"}},
		{HTTP: []string{"gh=https://h:0"}},
		{HTTP: []string{"gh=https://h/a/%2e%2e/b"}},
		{HTTP: []string{"gh=https://h/a%2fb"}},
		{HTTP: []string{"gh=https://"}},
		{HTTP: []string{"gh=https://h"}, Secret: []string{"gh=file:"}},
		{HTTP: []string{"gh=https://h"}, Secret: []string{"gh=stdin", "gh=stdin"}},
		{HTTP: []string{"gh=https://h"}, Secret: []string{"other=stdin"}},
		{HTTP: []string{"gh=https://h"}, Header: []string{"gh=Bearer {secret}"}},
		{HTTP: []string{"gh=https://h"}, Header: []string{"gh=Auth orization: {secret}"}},
		{HTTP: []string{"gh=https://h"}, Header: []string{"gh=X: {secret}{basic}"}},
		{HTTP: []string{"gh=https://h"}, Allow: []string{"gh=GET,TRACE"}},
		{HTTP: []string{"gh=https://h"}, Allow: []string{"gh=GET,,HEAD"}},
		{HTTP: []string{"gh=https://h"}, CA: []string{"gh="}},
	} {
		_, err := Parse(f)
		var ue *UsageError
		if !errors.As(err, &ue) || ue.Hint == "" {
			t.Errorf("%+v: %v, want a UsageError with a hint", f, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%+v: the message shows the password: %v", f, err)
		}
	}
}

func TestParseAccepts(t *testing.T) {
	specs, err := Parse(Flags{
		HTTP:   []string{"gh=https://api.example.org:8443/v3/", "llm=http://127.0.0.2", "l6=http://[::1]:8080/x", "lh=http://localhost"},
		Secret: []string{"llm=env:TOKEN", "gh=stdin"},
		Header: []string{"llm=x-api-key: {secret}"},
		Allow:  []string{"gh=get,post", "lh=*"},
	})
	if err != nil {
		t.Fatal(err)
	}
	gh, llm, lh := specs[0], specs[1], specs[3]
	if gh.UpstreamString() != "https://api.example.org:8443/v3" || gh.Prefix != "/v3" || gh.EnvName() != "AGENT_WRAP_HTTP_GH" {
		t.Errorf("gh: %+v", gh)
	}
	if !gh.Allows("POST") || gh.Allows("PUT") || !lh.Allows("DELETE") || lh.Allows("CONNECT") || lh.Allows("TRACE") {
		t.Errorf("methods: gh %v, lh %v", gh.Methods, lh.Methods)
	}
	if llm.Header != "X-Api-Key" || llm.Source != SourceEnv || llm.Where != "TOKEN" || specs[2].Source != SourceNone {
		t.Errorf("llm: %+v", llm)
	}
}

// Secrets and CAs: stdin lines in flag order (CAs first), a secret file
// that group or others may read refused, empty and control characters
// refused; Remote and LoadPassed carry them unchanged.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	os.WriteFile(tok, []byte("from-file\n"), 0o600)
	loose := filepath.Join(dir, "loose")
	os.WriteFile(loose, []byte("x\n"), 0o640)
	flags := Flags{HTTP: []string{"a=https://h", "b=https://i", "c=https://j"},
		Secret: []string{"c=stdin", "a=stdin", "b=file:" + tok}}
	specs, err := Parse(flags)
	if err != nil {
		t.Fatal(err)
	}
	if err := Load(specs, strings.NewReader("for-c\nfor-a\r\nrest"), os.Getenv); err != nil {
		t.Fatal(err)
	}
	got := Secrets(specs)
	if string(got["a"]) != "for-a" || string(got["b"]) != "from-file" || string(got["c"]) != "for-c" {
		t.Errorf("secrets %q", got)
	}
	// What run --detach hands its supervisor, loaded again.
	again, _ := Parse(flags)
	if err := LoadPassed(again, strings.NewReader(string(Passed(specs)))); err != nil {
		t.Fatal(err)
	}
	for k, v := range Secrets(again) {
		if string(v) != string(got[k]) {
			t.Errorf("passed %s: %q, want %q", k, v, got[k])
		}
	}
	args, _ := Remote(specs)
	if strings.Contains(strings.Join(args, " "), "for-") || strings.Contains(strings.Join(args, " "), tok) {
		t.Errorf("Remote args name a secret or a local file: %v", args)
	}
	for _, c := range []struct {
		secret, stdin string
		env           map[string]string
	}{
		{secret: "a=file:" + loose},
		{secret: "a=file:" + filepath.Join(dir, "none")},
		{secret: "a=env:EMPTY", env: map[string]string{"EMPTY": ""}},
		{secret: "a=stdin", stdin: "\n"},
		{secret: "a=stdin", stdin: ""},
		{secret: "a=stdin", stdin: "bad\x01token\n"},
	} {
		specs, err := Parse(Flags{HTTP: []string{"a=https://h"}, Secret: []string{c.secret}})
		if err != nil {
			t.Fatal(err)
		}
		err = Load(specs, strings.NewReader(c.stdin), func(k string) string { return c.env[k] })
		var ie *InputError
		if !errors.As(err, &ie) || ie.Hint == "" {
			t.Errorf("%s with stdin %q: %v, want an InputError with a hint", c.secret, c.stdin, err)
		}
		if err != nil && strings.Contains(err.Error(), "token") {
			t.Errorf("the message shows the secret: %v", err)
		}
	}
}

// Paths: whole segments, dots resolved, encoded separators refused.
func TestUpstreamPath(t *testing.T) {
	for in, want := range map[string]string{
		"/x":          "/api/x",
		"/a/./b/../c": "/api/a/c",
		"/":           "/api/",
		"/a%20b":      "/api/a%20b",
		"/..":         "",
		"/a/../..":    "",
		"/%2e%2e/x":   "",
		"/%2E%2e":     "",
		"/a%2fb":      "",
		"/a%5cb":      "",
		"/a\\b":       "",
		"/a%00":       "",
		"x":           "",
	} {
		got, ok := upstreamPath("/api", in)
		if (want == "") == ok || got != want {
			t.Errorf("upstreamPath(/api, %q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for p, want := range map[string]bool{"/api": true, "/api/": true, "/api/x": true, "/api-x": false, "/apix/y": false, "/": false} {
		if _, ok := insidePrefix("/api", p); ok != want {
			t.Errorf("insidePrefix(/api, %q) = %v", p, ok)
		}
	}
}
