package docs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agent-wrap/agent-wrap/httpgw"
)

// A CA file holds no secret, so the gateway takes one readable by anyone
// (0644), while a secret file must be its owner's alone. The docs once said
// both were refused; each document that speaks of the modes must now say
// what the code does.
func TestCAFileModeDocumented(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.pem")
	secret := filepath.Join(dir, "token")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("tok"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ca, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	load := func(secretSource string) error {
		specs, err := httpgw.Parse(httpgw.Flags{HTTP: []string{"gh=https://example.org"},
			Secret: []string{"gh=" + secretSource}, CA: []string{"gh=" + ca}})
		if err != nil {
			t.Fatal(err)
		}
		return httpgw.Load(specs, nil, func(string) string { return "tok" })
	}
	if err := load("env:TOK"); err != nil {
		t.Errorf("a 0644 CA file: %v, want it accepted", err)
	}
	if err := load("file:" + secret); err == nil || !strings.Contains(err.Error(), "readable by group or others") {
		t.Errorf("a 0644 secret file: %v, want it refused as readable by group or others", err)
	}

	// Every passage (a sentence or a table cell) that speaks of CA files
	// and of files readable by group or others says that only a secret file
	// may not be, or that a CA file may be.
	space := regexp.MustCompile(`\s+`)
	for _, doc := range []string{"guide.md", "reference.md", "authority.md", "controller.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := space.ReplaceAllString(string(b), " ")
		said := false
		for _, p := range regexp.MustCompile(`[.|] `).Split(text, -1) {
			if strings.Contains(p, "may be readable by anyone") {
				said = true
			}
		}
		for i, p := range regexp.MustCompile(`\. |\| `).Split(text, -1) {
			if strings.Contains(p, "CA") && strings.Contains(p, "readable by group or others") && !strings.Contains(p, "may be readable by anyone") && !strings.Contains(p, "secret file readable by group or others") {
				t.Errorf("%s, passage %d, refuses a CA file readable by group or others, which the gateway accepts: %q", doc, i, p)
			}
		}
		if !said {
			t.Errorf("%s does not say that a CA file may be readable by anyone", doc)
		}
	}
}
