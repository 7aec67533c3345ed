package e2e

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// 10 MB streamed through ssh arrive byte for byte as the job
// wrote them, and stdout.log holds the same bytes.
func TestStream10MBByteIdentical(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const id = "stream-10mb"
	const size = 10 << 20
	jobCopy := filepath.Join(t.TempDir(), "job-wrote.bin")
	// tee writes the same bytes to its stdout (the run's stdout.log) and to
	// jobCopy, the test's record of what the job wrote.
	job := "head -c " + strconv.Itoa(size) + " /dev/urandom | tee " + jobCopy
	s := h.start(nil, "run", "--lease", "60s", id, "--", "sh", "-c", job)
	if code := s.wait(t); code != 0 {
		t.Fatalf("run over ssh exited %d, want 0\nstderr: %s", code, s.stderr())
	}
	final := h.waitTerminal(id)
	wantFinal(t, final, "finished", "", 0)

	got := []byte(s.stdout())
	wrote, err := os.ReadFile(jobCopy)
	if err != nil {
		t.Fatal(err)
	}
	logged, err := os.ReadFile(filepath.Join(h.root, id, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(wrote) != size {
		t.Fatalf("the job wrote %d bytes, want %d", len(wrote), size)
	}
	if !bytes.Equal(logged, wrote) {
		t.Errorf("stdout.log (%d bytes, sha256 %x) differs from what the job wrote (%d bytes, sha256 %x)",
			len(logged), sha256.Sum256(logged), len(wrote), sha256.Sum256(wrote))
	}
	if !bytes.Equal(got, wrote) {
		t.Errorf("ssh delivered %d bytes (sha256 %x), the job wrote %d (sha256 %x)",
			len(got), sha256.Sum256(got), len(wrote), sha256.Sum256(wrote))
	}
}
