package cli

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// run runs one command line in-process and returns its stdout; any exit but
// 0 or anything on stderr fails the test.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	e := &Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	if code := e.Run(args); code != 0 || errb.Len() != 0 {
		t.Fatalf("%v: exit %d, stderr %q", args, code, errb.String())
	}
	return out.String()
}

// groff runs groff -man on page with extra arguments and returns stdout;
// anything on stderr (with -ww: every warning) fails the test.
func groff(t *testing.T, page string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("groff")
	if err != nil {
		t.Fatalf("groff is not installed: %v; hint: apt-get install groff (make deps does)", err)
	}
	cmd := exec.Command(path, append([]string{"-man", "-Tutf8", "-ww"}, args...)...)
	cmd.Stdin = strings.NewReader(page)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || errb.Len() != 0 {
		t.Fatalf("groff %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// TestManPage renders `agent-wrap help --man` with groff, warnings on, and
// checks it against what --help prints, read back from the help text
// itself: every command `agent-wrap help` lists, with its synopsis, every
// flag its --help shows and its exit line, and every exit code any command
// names explained under EXIT STATUS.
func TestManPage(t *testing.T) {
	page := runOK(t, "help", "--man")
	if !strings.HasPrefix(page, `.TH "AGENT\-WRAP" "1" `) {
		t.Fatalf("man page does not start with .TH AGENT-WRAP 1:\n%.200s", page)
	}
	groff(t, page, "-z") // warnings only
	// Plain text (no bold, no underline), lines wide enough never to
	// break a flag, no hyphenation; then runs of spaces as one.
	text := groff(t, page, "-P-cbou", "-rLL=2000n", "-rHY=0")
	text = regexp.MustCompile(`[ \t]+`).ReplaceAllString(text, " ")

	section := func(name, next string) string {
		i := strings.Index(text, "\n"+name+"\n")
		j := strings.Index(text, "\n"+next+"\n")
		if i < 0 || j < i {
			t.Fatalf("man page has no section %s before %s:\n%s", name, next, text)
		}
		return text[i:j]
	}
	cmds := section("COMMANDS", "EXIT STATUS")
	exitStatus := section("EXIT STATUS", "ENVIRONMENT")

	names := regexp.MustCompile(`(?m)^  ([a-z]+) `).FindAllStringSubmatch(runOK(t, "help"), -1)
	if len(names) < 15 {
		t.Fatalf("help lists %d commands", len(names))
	}
	flagLine := regexp.MustCompile(`^  (?:-([a-zA-Z]), |    )--([a-z0-9-]+)(?: (\S+))?  `)
	codes := map[string]bool{}
	for _, m := range names {
		name := m[1]
		// This command's subsection: from its heading to the next one.
		i := strings.Index(cmds, "\n "+name+"\n")
		if i < 0 {
			t.Errorf("no subsection for %s", name)
			continue
		}
		sub := cmds[i+1:]
		if j := regexp.MustCompile(`\n [a-z]+\n`).FindStringIndex(sub[1:]); j != nil {
			sub = sub[:j[0]+1]
		}
		help := runOK(t, name, "--help")
		usage, _, _ := strings.Cut(strings.TrimPrefix(help, "usage: "), "\n")
		if !strings.Contains(sub, " "+strings.Join(strings.Fields(usage), " ")+"\n") {
			t.Errorf("%s: the man page lacks the synopsis %q:\n%s", name, usage, sub)
		}
		inFlags := false
		nflags := 0
		for _, l := range strings.Split(help, "\n") {
			switch {
			case l == "flags:":
				inFlags = true
				continue
			case l == "":
				inFlags = false
			}
			if strings.HasPrefix(l, "exit: ") {
				exits := strings.TrimPrefix(l, "exit: ")
				if !strings.Contains(sub, strings.Join(strings.Fields("Exit: "+exits), " ")) {
					t.Errorf("%s: the man page lacks the exit line %q", name, exits)
				}
				for _, c := range regexp.MustCompile(`\b\d+\b`).FindAllString(exits, -1) {
					codes[c] = true
				}
			}
			if !inFlags {
				continue
			}
			f := flagLine.FindStringSubmatch(l)
			if f == nil {
				t.Errorf("%s: cannot read the flag line %q", name, l)
				continue
			}
			nflags++
			want := "--" + f[2]
			if f[1] != "" {
				want = "-" + f[1] + ", " + want
			}
			if f[3] != "" {
				want += " " + f[3]
			}
			if !regexp.MustCompile(`\n ` + regexp.QuoteMeta(want) + `[ \n]`).MatchString(sub) {
				t.Errorf("%s: the man page lacks the flag %q:\n%s", name, want, sub)
			}
		}
		if nflags == 0 && name != "completion" {
			t.Errorf("%s: read no flags from its help:\n%s", name, help)
		}
	}
	if len(codes) < 10 {
		t.Fatalf("read only %d exit codes from the help", len(codes))
	}
	for c := range codes {
		if !regexp.MustCompile(`(?m)^ [^\n]*\b` + c + `\b`).MatchString(exitStatus) {
			t.Errorf("exit code %s (named in some command's exit line) is not explained under EXIT STATUS:\n%s", c, exitStatus)
		}
	}
}

// help --man takes no COMMAND: a usage error with a hint.
func TestManPageUsage(t *testing.T) {
	var out, errb bytes.Buffer
	e := &Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	if code := e.Run([]string{"help", "--man", "run"}); code != ExitUsage || out.Len() != 0 ||
		!strings.Contains(errb.String(), "takes no COMMAND") || !strings.Contains(errb.String(), "hint:") {
		t.Fatalf("help --man run: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
