package main

import (
	"os"
	"strings"
	"testing"
)

// BENCHMARKS.md is what awbench writes, not a document edited by hand: the
// text awbench fixes (how each figure is measured, how to reproduce it)
// stands in it as awbench would write it now, so a change to either shows
// in the other.
func TestBenchmarksMatchTheGenerator(t *testing.T) {
	b, err := os.ReadFile("../../../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.Contains(doc, methods+floorMethods+scaleMethods) {
		t.Errorf("BENCHMARKS.md's \"How each figure is measured\" is not what awbench writes; run make bench")
	}
	if !strings.HasSuffix(doc, reproduce()) {
		t.Errorf("BENCHMARKS.md does not end with awbench's \"Reproducing the figures\"; run make bench")
	}
}
