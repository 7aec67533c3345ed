package cli

import (
	"fmt"
	"io"
	"strings"
)

// `agent-wrap help --man` prints agent-wrap(1) in roff (the man macros),
// built from the command table (describe.go): the overview usage prints,
// then one subsection per command with its synopsis, purpose, text, flags
// and exit codes, the words --help prints.

// manName is the man page's NAME line after "agent-wrap \-".
const manName = "run a command under a lease, stop its whole process tree for sure, and say what happened"

// exitStatus is the man page's EXIT STATUS list: every code a command's
// exit line names, once. docs/reference.md ("Exit codes") says the same at
// more length; both agree with package exitcode's table (tests check).
var exitStatus = []struct{ code, meaning string }{
	{"0", "success: the job's own 0, a run completed or cancelled and confirmed, an answer given"},
	{"1", "the command's own failure or refusal (renew refused, cancel not confirmed, a broken journal, an unreadable record); the message says which"},
	{"3", "reconcile, settle: some run is still running"},
	{"4", "reconcile, settle, logs -f: some outcome is unknown"},
	{"1-123", "run, wait, attach, ssh: the job's own exit code"},
	{"64", "usage error; nothing was claimed or written"},
	{"66", "no such run (or no run root at all); run, ssh: an --http-secret or --http-ca that cannot be had"},
	{"69", "ledger, settle: a PostgreSQL ledger's database cannot be reached"},
	{"70", "run: a launch failure other than 126 and 127"},
	{"75", "run: the ID is taken by a live run or one whose outcome is unknown; wait: --timeout passed or the outcome is unknown; ssh: inside a run that is ending"},
	{"77", "ssh, ledger, settle: the database refused the login or the access"},
	{"78", "unsafe run root, run directory or ledger; a database without this version's ledger"},
	{"124", "run, wait: the lease expired"},
	{"125", "run: agent-wrap itself failed before the job could start; on a system that is not Linux, every host command"},
	{"126", "run: the command is not executable"},
	{"127", "run: the command was not found; ssh: the host has no agent-wrap"},
	{"128+N", "run, wait: the job died of signal N"},
	{"129, 130, 143", "run, wait, ssh: cancelled by HUP, INT, TERM (or the cancel command)"},
	{"255", "ssh: the outcome could not be learned, or the first connection failed for good; settle: some host unreachable"},
}

// writeMan writes the man page.
func writeMan(w io.Writer) {
	docs := describeCommands()
	ver, _ := Version()
	m := &roff{w: w}
	m.req("TH", "AGENT-WRAP", "1", "", "agent-wrap "+ver, "User Commands")
	m.req("SH", "NAME")
	m.line(`agent-wrap \- ` + escape(manName))

	m.req("SH", "SYNOPSIS")
	for i, syn := range usageForms {
		if i > 0 {
			m.req("br")
		}
		m.synopsis(strings.TrimPrefix(syn, "agent-wrap "))
	}

	m.req("SH", "DESCRIPTION")
	m.text(shortFormText)
	m.req("PP")
	m.text(sentence(rootText))
	m.req("PP")
	m.text("'agent-wrap help COMMAND' and 'agent-wrap COMMAND --help' print what this page says of COMMAND.")

	m.req("SH", "COMMANDS")
	for _, d := range docs {
		m.req("SS", d.name)
		for i, syn := range d.synopses() {
			if i > 0 {
				m.req("br")
			}
			m.synopsis("[--root DIR] " + syn)
		}
		m.req("PP")
		m.text(sentence(d.summary))
		if d.help != "" {
			m.req("PP")
			m.paragraphs(d.help)
		}
		if len(d.flags) > 0 {
			m.req("PP")
			m.line("Flags:")
			for _, f := range d.flags {
				m.req("TP")
				head := ""
				if f.short != "" {
					head = `\fB\-` + escape(f.short) + `\fR, `
				}
				head += `\fB\-\-` + escape(f.name) + `\fR`
				if f.arg != "" {
					head += ` \fI` + escape(f.arg) + `\fR`
				}
				m.line(head)
				m.text(f.usage)
			}
		}
		m.req("PP")
		m.text(sentence("exit: " + d.exits))
	}

	m.req("SH", "EXIT STATUS")
	m.text(exitText)
	for _, x := range exitStatus {
		m.req("TP")
		m.line(`\fB` + escape(x.code) + `\fR`)
		m.text(x.meaning)
	}

	if names, by := environment(docs); len(names) > 0 {
		m.req("SH", "ENVIRONMENT")
		for _, v := range names {
			m.req("TP")
			m.line(`\fB` + escape(v) + `\fR`)
			m.text("named by: " + strings.Join(by[v], ", ") + " (see each command above)")
		}
	}

	m.req("SH", "SEE ALSO")
	m.line(`\fBssh\fR(1), \fBsystemd.service\fR(5), \fBsystemctl\fR(1)`)
	m.req("PP")
	m.text("The reference and the controller's documentation: docs/reference.md and docs/controller.md in agent-wrap's source (installed under /usr/share/doc/agent-wrap when it came from a package).")
}

// sentence makes a help line (lowercase, no period) a sentence.
func sentence(s string) string {
	if s == "" {
		return s
	}
	s = strings.ToUpper(s[:1]) + s[1:]
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}

// roff writes man(7) markup.
type roff struct{ w io.Writer }

// req writes one request: .NAME ARG..., each argument text, escaped and
// quoted.
func (m *roff) req(name string, args ...string) {
	fmt.Fprint(m.w, "."+name)
	for _, a := range args {
		fmt.Fprintf(m.w, ` "%s"`, strings.ReplaceAll(escape(a), `"`, `\(dq`))
	}
	fmt.Fprintln(m.w)
}

// raw writes one line of markup as it is.
func (m *roff) raw(s string) { fmt.Fprintln(m.w, s) }

// line writes one line of already escaped text.
func (m *roff) line(s string) {
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	fmt.Fprintln(m.w, s)
}

// text writes plain text, filled.
func (m *roff) text(s string) {
	m.line(escape(strings.Join(strings.Fields(s), " ")))
}

// paragraphs writes help text: a blank line starts a new paragraph, a line
// "  - ..." an item of a list (its indented lines continue it), and a line
// that is not indented after a list ends the list.
func (m *roff) paragraphs(help string) {
	var cur []string
	inList := false
	flush := func() {
		if len(cur) > 0 {
			m.text(strings.Join(cur, " "))
			cur = nil
		}
	}
	for _, l := range strings.Split(strings.TrimRight(help, "\n"), "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case trimmed == "":
			flush()
			m.req("PP")
			inList = false
		case strings.HasPrefix(trimmed, "- ") && l != trimmed:
			flush()
			m.raw(`.IP \(bu 2`)
			cur = append(cur, strings.TrimPrefix(trimmed, "- "))
			inList = true
		case inList && l == trimmed:
			flush()
			m.req("PP")
			inList = false
			cur = append(cur, trimmed)
		default:
			cur = append(cur, trimmed)
		}
	}
	flush()
}

// synopsis writes a command line: words that start with "-" bold, the
// upper-case placeholders italic, the rest as it is.
func (m *roff) synopsis(s string) {
	var b strings.Builder
	b.WriteString(`\fBagent\-wrap\fR`)
	for _, word := range strings.Fields(s) {
		b.WriteString(" ")
		b.WriteString(synopsisWord(word))
	}
	// Neither hyphenated nor stretched to the right margin.
	m.raw(".nh")
	m.raw(".ad l")
	m.line(b.String())
	m.raw(".ad b")
	m.raw(".hy")
}

// synopsisWord marks up one word of a synopsis: the brackets, bars and
// dots as they are, a flag bold, an upper-case placeholder italic, a
// command name bold.
func synopsisWord(w string) string {
	var b strings.Builder
	for len(w) > 0 {
		i := strings.IndexFunc(w, func(r rune) bool { return !strings.ContainsRune("[]|.,", r) })
		if i < 0 {
			b.WriteString(escape(w))
			break
		}
		b.WriteString(escape(w[:i]))
		w = w[i:]
		j := strings.IndexFunc(w, func(r rune) bool { return strings.ContainsRune("[]|", r) })
		if j < 0 {
			j = len(w)
		}
		tok := w[:j]
		tail := ""
		if t := strings.TrimRight(tok, "."); t != tok && t != "" {
			tok, tail = t, tok[len(t):]
		}
		switch {
		case strings.HasPrefix(tok, "-"):
			b.WriteString(`\fB` + escape(tok) + `\fR`)
		case tok == strings.ToUpper(tok):
			b.WriteString(`\fI` + escape(tok) + `\fR`)
		default:
			b.WriteString(`\fB` + escape(tok) + `\fR`)
		}
		b.WriteString(escape(tail))
		w = w[j:]
	}
	return b.String()
}

// escape makes s safe as roff text: backslashes doubled as \e, every "-"
// a minus (flags are typed as they read), and the dot of "..." and
// apostrophes harmless where a line might start with them.
func escape(s string) string {
	r := strings.NewReplacer(`\`, `\e`, "-", `\-`, "'", `\(aq`)
	return r.Replace(s)
}
