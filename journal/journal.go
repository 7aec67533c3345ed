// Package journal is a run's append-only, hash-chained audit log,
// events.jsonl: one JSON object per line with seq (1, 2, ...), at (RFC 3339
// UTC, nanoseconds), mono_ns (CLOCK_BOOTTIME), event, the event's fields, and
// prev, the hex SHA-256 of the previous line's bytes without its newline (""
// for the first line).
//
// Appends from several processes (wrapper, cancel, watchdog) are serialised
// with flock on the journal file itself; each append reads the current last
// line under that lock (a Writer that made the last line itself knows it),
// so seq and prev are always right. An append with
// sync set is fsynced before Append returns: that is how an intent is on disk
// before the first signal is sent. The claim reserves space beyond the
// journal's end (Writer.Reserve) and appends keep it reserved, so a full
// disk cannot silence a stop; a torn last line is recorded (journal_torn)
// and stepped over, never a reason to refuse a line. A run's record carries
// the journal's last line when it was written (Mark), which VerifyMark
// checks, so a journal cut at a line boundary is caught. The journal never holds environment
// values, tokens or command output: callers pass only the fields named in
// docs/reference.md.
package journal

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"
)

// Fields are an event's own fields. Keys seq, at, mono_ns, event and prev are
// reserved.
type Fields map[string]any

var reserved = map[string]bool{"seq": true, "at": true, "mono_ns": true, "event": true, "prev": true}

// Entry is one parsed journal line.
type Entry struct {
	Seq    int64          `json:"seq"`
	At     time.Time      `json:"at"`
	MonoNS int64          `json:"mono_ns"`
	Event  string         `json:"event"`
	Prev   string         `json:"prev"`
	Fields map[string]any `json:"-"`
}

// encode renders one line (without newline). Keys come in a fixed order:
// seq, at, mono_ns, event, the fields sorted by name, prev.
func encode(seq int64, at time.Time, mono int64, event string, f Fields, prev string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"seq":`)
	b.WriteString(strconv.FormatInt(seq, 10))
	b.WriteString(`,"at":`)
	ts, _ := json.Marshal(at.UTC().Format(time.RFC3339Nano))
	b.Write(ts)
	b.WriteString(`,"mono_ns":`)
	b.WriteString(strconv.FormatInt(mono, 10))
	b.WriteString(`,"event":`)
	ev, err := json.Marshal(event)
	if err != nil {
		return nil, err
	}
	b.Write(ev)
	keys := make([]string, 0, len(f))
	for k := range f {
		if reserved[k] {
			return nil, fmt.Errorf("journal: field %q is reserved", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(f[k])
		if err != nil {
			return nil, fmt.Errorf("journal: field %q: %w", k, err)
		}
		b.WriteByte(',')
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteString(`,"prev":"`)
	b.WriteString(prev)
	b.WriteString(`"}`)
	return b.Bytes(), nil
}

// Hash returns the chain value of a line: hex SHA-256 of its bytes.
func Hash(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:])
}

// ParseLine parses one line (without newline). It rejects what is not a
// JSON object with a positive seq, an at time, an event name and a prev.
func ParseLine(line []byte) (Entry, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return Entry{}, fmt.Errorf("not a JSON object: %v", err)
	}
	var e Entry
	for _, k := range []string{"seq", "at", "mono_ns", "event", "prev"} {
		if _, ok := raw[k]; !ok {
			return Entry{}, fmt.Errorf("no %q field", k)
		}
	}
	if err := json.Unmarshal(raw["seq"], &e.Seq); err != nil || e.Seq < 1 {
		return Entry{}, fmt.Errorf("seq is not a positive integer")
	}
	var at string
	if err := json.Unmarshal(raw["at"], &at); err != nil {
		return Entry{}, fmt.Errorf("at is not a string")
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return Entry{}, fmt.Errorf("at: %v", err)
	}
	e.At = t
	if err := json.Unmarshal(raw["mono_ns"], &e.MonoNS); err != nil {
		return Entry{}, fmt.Errorf("mono_ns is not an integer")
	}
	if err := json.Unmarshal(raw["event"], &e.Event); err != nil || e.Event == "" {
		return Entry{}, fmt.Errorf("event is not a non-empty string")
	}
	if err := json.Unmarshal(raw["prev"], &e.Prev); err != nil || !validPrev(raw["prev"], e.Prev) {
		return Entry{}, fmt.Errorf("prev is not \"\" or a hex SHA-256")
	}
	e.Fields = map[string]any{}
	for k, v := range raw {
		if reserved[k] {
			continue
		}
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return Entry{}, fmt.Errorf("field %q: %v", k, err)
		}
		e.Fields[k] = x
	}
	return e, nil
}

// validPrev reports whether a prev field is a JSON string (not null) holding
// "" or 64 lowercase hex digits, as Hash writes it.
func validPrev(raw json.RawMessage, prev string) bool {
	if len(raw) == 0 || raw[0] != '"' {
		return false
	}
	if prev == "" {
		return true
	}
	if len(prev) != 64 {
		return false
	}
	for i := 0; i < len(prev); i++ {
		if c := prev[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// BadLineError names the first line of a journal that breaks the chain.
type BadLineError struct {
	Line   int // 1-based
	Reason string
}

func (e *BadLineError) Error() string {
	return fmt.Sprintf("journal line %d: %s", e.Line, e.Reason)
}

// ErrEmpty is returned by Verify for a journal with no lines.
var ErrEmpty = errors.New("journal is empty")

// Mark names one line of a journal by its seq and the hash of its bytes: a
// record carries the journal's last line as it was when the record was
// written (journal_seq, journal_hash), so a journal cut at a line boundary,
// which still chains, is told from a whole one.
type Mark struct {
	Seq  int64
	Hash string
}

// Verify reads a whole journal and checks every line: it parses, its seq is
// its line number, and its prev is the hash of the line before. It returns
// the number of lines, and a *BadLineError for the first bad one.
func Verify(r io.Reader) (int, error) {
	return VerifyMark(r, Mark{})
}

// VerifyMark is Verify, and also checks that the journal holds the line m
// names (m.Seq 0: no mark), with that hash: a journal cut after the mark's
// line was written, at a line boundary or not, is broken, and the error
// names its last line and the mark.
func VerifyMark(r io.Reader, m Mark) (int, error) {
	br := bufio.NewReader(r)
	prev := ""
	n := 0
	var pending *BadLineError // a bad line, reported once the next is seen
	for {
		line, err := br.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			break
		}
		n++
		if err == io.EOF {
			if pending != nil {
				return n, pending
			}
			return n, &BadLineError{Line: n, Reason: "no trailing newline (a torn write)"}
		}
		if err != nil {
			return n, err
		}
		line = line[:len(line)-1]
		e, perr := ParseLine(line)
		if pending != nil {
			// The line after a bad one: a journal_torn line that names it
			// says why it is bad.
			if perr == nil && e.Event == "journal_torn" && lineField(e, "line") == int64(pending.Line) {
				pending.Reason += fmt.Sprintf("; line %d (journal_torn) records it as torn, and the journal goes on from there", n)
			}
			return n, pending
		}
		if perr != nil {
			pending = &BadLineError{Line: n, Reason: perr.Error()}
			continue
		}
		if e.Seq != int64(n) {
			return n, &BadLineError{Line: n, Reason: fmt.Sprintf("seq is %d, want %d", e.Seq, n)}
		}
		if e.Prev != prev {
			return n, &BadLineError{Line: n, Reason: "prev does not match the hash of the line before (edited, removed or reordered)"}
		}
		prev = Hash(line)
		if m.Seq == int64(n) && prev != m.Hash {
			return n, &BadLineError{Line: n, Reason: "the run's record names another line " + strconv.Itoa(n) + " (journal_hash differs): the journal was rewritten from here"}
		}
	}
	if pending != nil {
		return n, pending
	}
	if n == 0 {
		return 0, ErrEmpty
	}
	if m.Seq > int64(n) {
		return n, &BadLineError{Line: n + 1, Reason: fmt.Sprintf("missing: the journal ends at line %d, but the run's record was written after line %d (journal_seq): it was cut", n, m.Seq)}
	}
	return n, nil
}

// lineField reads an integer field of an entry (-1 when absent).
func lineField(e Entry, k string) int64 {
	if v, ok := e.Fields[k].(float64); ok {
		return int64(v)
	}
	return -1
}

// Evidence parses the lines of a journal that parse, skipping those that
// do not (a torn line, a garbled one), and keeps those whose event is one
// of events (all when none is named). It does not check the chain: it is
// for reading what a run's journal says when other files are unreadable.
func Evidence(r io.Reader, events ...string) []Entry {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	var want [][]byte
	for _, ev := range events {
		b, _ := json.Marshal(ev)
		want = append(want, append([]byte(`"event":`), b...))
	}
	for sc.Scan() {
		line := sc.Bytes()
		if len(want) > 0 {
			hit := false
			for _, w := range want {
				if bytes.Contains(line, w) {
					hit = true
					break
				}
			}
			if !hit {
				continue
			}
		}
		e, err := ParseLine(line)
		if err != nil {
			continue
		}
		if len(events) > 0 {
			ok := false
			for _, ev := range events {
				ok = ok || e.Event == ev
			}
			if !ok {
				continue
			}
		}
		out = append(out, e)
	}
	return out
}

// ReadAll parses every line of a journal, stopping at the first line that
// does not parse. It does not check the chain (Verify does).
func ReadAll(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for i := 1; sc.Scan(); i++ {
		e, err := ParseLine(sc.Bytes())
		if err != nil {
			return out, &BadLineError{Line: i, Reason: err.Error()}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
