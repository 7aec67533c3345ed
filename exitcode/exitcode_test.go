package exitcode

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// docsTable reads the rows of docs/reference.md's "Exit codes" table:
// code and from columns, as written.
func docsTable(t *testing.T) [][2]string {
	t.Helper()
	b, err := os.ReadFile("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Exit codes\n")
	if !ok {
		t.Fatal(`docs/reference.md has no "## Exit codes" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var rows [][2]string
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| code |") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 {
			t.Fatalf("row with %d cells: %q", len(cells), line)
		}
		rows = append(rows, [2]string{strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])})
	}
	return rows
}

// The reference's table and Table agree row for row: the same codes, the
// same commands, in the same order.
func TestDocsTableIsTable(t *testing.T) {
	docs := docsTable(t)
	if len(docs) != len(Table) {
		t.Errorf("docs/reference.md has %d exit code rows, Table %d", len(docs), len(Table))
	}
	for i := 0; i < len(docs) && i < len(Table); i++ {
		if got, want := docs[i], [2]string{Table[i].Codes, Table[i].From}; got != want {
			t.Errorf("row %d: docs/reference.md says %q, Table %q", i+1, got, want)
		}
	}
}

// Confirm names exactly the codes agent-wrap or a cancel gives: the list
// the controller held before the table, and nothing that is not a code.
func TestConfirm(t *testing.T) {
	var got []int
	for c := -1; c <= 256; c++ {
		if Confirm(c) {
			got = append(got, c)
		}
	}
	want := []int{-1, Failure, Usage, NoInput, Software, TempFail, Config, Lease, Cannot, NotExecutable, NotFound, HUP, INT, TERM, 256}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Confirm holds %v, want %v", got, want)
	}
}

func TestNumbers(t *testing.T) {
	for codes, want := range map[string][]int{
		"124":             {124},
		"126 / 127":       {126, 127},
		"143 / 130 / 129": {143, 130, 129},
		"0-3":             {0, 1, 2, 3},
	} {
		if got := (Row{Codes: codes}).Numbers(); !reflect.DeepEqual(got, want) {
			t.Errorf("Numbers(%q) = %v, want %v", codes, got, want)
		}
	}
	if n := (Row{Codes: "128+N"}).Numbers(); len(n) != 126 || n[0] != 129 || n[len(n)-1] != 254 {
		t.Errorf("Numbers(128+N) = %d codes from %d to %d, want 126 from 129 to 254", len(n), n[0], n[len(n)-1])
	}
	// Every row's codes parse.
	for _, r := range append(append([]Row{}, Table...), SSH...) {
		if len(r.Numbers()) == 0 {
			t.Errorf("row %q names no code", r.Codes)
		}
	}
}
