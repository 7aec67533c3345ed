package deploy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-wrap/agent-wrap/rundir"
)

func TestChooseMethod(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		systemd, timer, cron bool
		want                 Method
	}{
		{"systemd", true, false, false, Systemd},
		{"timer", false, true, false, Systemd},
		{"systemd-timer", true, true, false, Systemd},
		{"cron", false, false, true, Cron},
	} {
		if m, guessed := ChooseMethod(tc.systemd, tc.timer, tc.cron); m != tc.want || guessed {
			t.Errorf("%s: ChooseMethod = %s, guessed %v; want %s, asked for", tc.name, m, guessed, tc.want)
		}
	}
	want := Cron
	if SystemdRunning() {
		want = Systemd
	}
	if m, guessed := ChooseMethod(false, false, false); m != want || !guessed {
		t.Errorf("neither asked: ChooseMethod = %s, guessed %v; want %s (systemd running: %v), guessed", m, guessed, want, SystemdRunning())
	}
}

// fakeCron puts a cron daemon (that does nothing) and a crontab program on
// a PATH of their own, with no system directories searched: the crontab
// keeps what it is given in the returned file, or fails with exit 3 when
// failing is set.
func fakeCron(t *testing.T, failing bool) (kept string) {
	t.Helper()
	old := CronDirs
	CronDirs = nil
	t.Cleanup(func() { CronDirs = old })
	bin := t.TempDir()
	kept = filepath.Join(t.TempDir(), "crontab.txt")
	crontab := "#!/bin/sh\n[ \"$1\" = -l ] && exit 1\ncat >" + kept + "\n"
	if failing {
		crontab = "#!/bin/sh\necho crontab: refused >&2\nexit 3\n"
	}
	for name, body := range map[string]string{"cron": "#!/bin/sh\nexit 0\n", "crontab": crontab} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":/usr/bin:/bin")
	return kept
}

// userCron is a --cron --user install for a home in a temp dir, its run
// root not made yet.
func userCron(t *testing.T) Options {
	home := t.TempDir()
	return Options{Method: Cron, User: true, Home: home, RunRoot: filepath.Join(home, "runs"), Executable: fakeBinary(t)}
}

// nothingWritten says the install left home as it found it (only the
// entries in keep).
func nothingWritten(t *testing.T, home string, keep ...string) {
	t.Helper()
	ents, _ := os.ReadDir(home)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != strings.Join(keep, " ") {
		t.Errorf("home holds %v after a refused install, want %v", names, keep)
	}
}

func stepOf(err error) Step {
	var ie *InstallError
	if errors.As(err, &ie) {
		return ie.Step
	}
	return 0
}

// Install refuses, before it writes anything or makes the run root, a plan
// NewPlan refuses, cron where nothing would run the line, and an existing
// run root the watchdog would refuse; each refusal names its step.
func TestInstallRefusesBeforeWriting(t *testing.T) {
	t.Run("plan/path-needs-quoting", func(t *testing.T) {
		o := userCron(t)
		o.RunRoot = filepath.Join(o.Home, "my runs")
		var out strings.Builder
		in, err := Install(o, "", false, &out)
		if in != nil || stepOf(err) != StepPlan || !strings.Contains(err.Error(), "must be a clean absolute path") {
			t.Errorf("Install = %v, %v; want a StepPlan error about the path", in, err)
		}
		if out.Len() != 0 {
			t.Errorf("printed %q", out.String())
		}
		nothingWritten(t, o.Home)
	})
	t.Run("cron/none-here", func(t *testing.T) {
		old := CronDirs
		CronDirs = nil
		t.Cleanup(func() { CronDirs = old })
		t.Setenv("PATH", t.TempDir())
		o := userCron(t)
		var out strings.Builder
		_, err := Install(o, "", false, &out)
		var cm *CronMissingError
		if stepOf(err) != StepCron || !errors.As(err, &cm) || len(cm.Missing) != 2 {
			t.Fatalf("Install = %v; want a StepCron error missing a cron daemon and the crontab program", err)
		}
		if want := "nothing here would run the watchdog: missing a cron daemon"; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), " and the crontab program") {
			t.Errorf("error %q", err)
		}
		if out.Len() != 0 {
			t.Errorf("printed %q", out.String())
		}
		nothingWritten(t, o.Home)

		// Under a destination root the files are for another system,
		// whose cron this one cannot see: no refusal, nothing outside it.
		dest := t.TempDir()
		if _, err := Install(o, dest, false, &out); err != nil {
			t.Errorf("Install under a destination root: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dest, o.Home, ".local/bin/agent-wrap")); err != nil {
			t.Errorf("binary under the destination root: %v", err)
		}
		nothingWritten(t, o.Home)
	})
	t.Run("root/writable-by-others", func(t *testing.T) {
		fakeCron(t, false)
		o := userCron(t)
		if err := os.Mkdir(o.RunRoot, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(o.RunRoot, 0o777); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		_, err := Install(o, "", false, &out)
		if stepOf(err) != StepRoot || !errors.Is(err, rundir.ErrUnsafe) || !strings.Contains(err.Error(), "writable by group or others") {
			t.Errorf("Install = %v; want a StepRoot error, unsafe, writable by others", err)
		}
		if out.Len() != 0 {
			t.Errorf("printed %q", out.String())
		}
		nothingWritten(t, o.Home, "runs")
	})
}

// A user cron install for real (a home in a temp dir, a crontab program
// that keeps what /bin/sh pipes to it): the run root is made 0700 and
// said so, the files are written, and Activate runs the activation
// command, whose crontab then holds the watchdog line. Installing again
// changes nothing and runs nothing. A failing crontab is a StepActivate
// error naming the command, with the files left in place.
func TestInstallActivates(t *testing.T) {
	kept := fakeCron(t, false)
	o := userCron(t)
	var out, diag strings.Builder
	in, err := Install(o, "", false, &out)
	if err != nil {
		t.Fatal(err)
	}
	crontabFile := filepath.Join(o.Home, ".config/agent-wrap/watchdog.crontab")
	want := "created: " + o.RunRoot + "\n" +
		"installed: " + filepath.Join(o.Home, ".local/bin/agent-wrap") + "\n" +
		"created: " + filepath.Join(o.Home, ".local/state/agent-wrap") + "\n" +
		"installed: " + crontabFile + "\n"
	if out.String() != want || !in.RootCreated || in.Changed != 4 {
		t.Errorf("Install printed\n%s(root created %v, %d changed); want\n%s(true, 4)", out.String(), in.RootCreated, in.Changed, want)
	}
	if fi, err := os.Stat(o.RunRoot); err != nil || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
		t.Errorf("run root: %v, %v; want a 0700 directory", fi, err)
	}
	out.Reset()
	if err := in.Activate(context.Background(), &out, &diag); err != nil {
		t.Fatalf("Activate: %v\n%s", err, diag.String())
	}
	if want := "ran: " + in.Plan.Activate + "\n"; out.String() != want || in.Ran != in.Plan.Activate {
		t.Errorf("Activate printed %q, ran %q; want %q", out.String(), in.Ran, want)
	}
	line := filepath.Join(o.Home, ".local/bin/agent-wrap") + " --root " + o.RunRoot + " watchdog --once"
	if b, err := os.ReadFile(kept); err != nil || !strings.Contains(string(b), line) {
		t.Errorf("crontab was given (%v):\n%s\nwant a line running %s", err, b, line)
	}

	t.Run("again-nothing-changed", func(t *testing.T) {
		if err := os.Remove(kept); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		in, err := Install(o, "", false, &out)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out.String(), "unchanged: "); n != 3 || !strings.HasSuffix(out.String(), "\nnothing changed\n") || in.RootCreated {
			t.Errorf("second Install printed\n%s(root created %v)", out.String(), in.RootCreated)
		}
		out.Reset()
		if err := in.Activate(context.Background(), &out, &diag); err != nil || out.Len() != 0 || in.Ran != "" {
			t.Errorf("Activate with nothing changed = %v, printed %q, ran %q; want nothing", err, out.String(), in.Ran)
		}
		if _, err := os.Stat(kept); err == nil {
			t.Error("crontab was run again with nothing changed")
		}
	})
	t.Run("crontab-fails", func(t *testing.T) {
		fakeCron(t, true)
		if err := os.Remove(crontabFile); err != nil {
			t.Fatal(err)
		}
		var out, diag strings.Builder
		in, err := Install(o, "", false, &out)
		if err != nil {
			t.Fatal(err)
		}
		out.Reset()
		err = in.Activate(context.Background(), &out, &diag)
		if stepOf(err) != StepActivate || !strings.HasPrefix(err.Error(), in.Plan.Activate+": ") || !strings.Contains(err.Error(), "exit status 3") {
			t.Errorf("Activate = %v; want a StepActivate error naming the command and its exit status", err)
		}
		if out.Len() != 0 || diag.String() != "crontab: refused\n" || in.Ran != "" {
			t.Errorf("Activate printed %q, diag %q, ran %q; want nothing, crontab's complaint, nothing", out.String(), diag.String(), in.Ran)
		}
		if _, err := os.Stat(crontabFile); err != nil {
			t.Errorf("the files are not left in place: %v", err)
		}
	})
}

// Where the activation cannot be run here (a dry run, a destination root,
// no systemd running) Activate says what to run instead, and for systemd
// user units how to keep them running after logout.
func TestActivateSaysWhatIsNext(t *testing.T) {
	fakeCron(t, false)
	o := userCron(t)
	var out strings.Builder
	in, err := Install(o, "", true, &out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "created: ") || !strings.Contains(out.String(), "would install: ") {
		t.Errorf("dry run printed\n%s", out.String())
	}
	if _, err := os.Stat(o.RunRoot); err == nil {
		t.Error("a dry run made the run root")
	}
	out.Reset()
	if err := in.Activate(context.Background(), &out, &out); err != nil || out.String() != "next: "+in.Plan.Activate+"\n" {
		t.Errorf("Activate after a dry run = %v, printed %q; want the next line", err, out.String())
	}

	o = Options{Method: Systemd, User: true, Home: "/home/al", UserName: "al", RunRoot: "/home/al/.agent-runs", Executable: fakeBinary(t)}
	if in, err = Install(o, t.TempDir(), false, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := in.Activate(context.Background(), &out, &out); err != nil {
		t.Fatal(err)
	}
	want := "next: systemctl --user daemon-reload && systemctl --user enable agent-wrap-watchdog.service && systemctl --user restart agent-wrap-watchdog.service\n" +
		"next: loginctl enable-linger al  # keeps the watchdog running while al is logged out\n"
	if out.String() != want {
		t.Errorf("Activate of user units under a destination root printed\n%s\nwant\n%s", out.String(), want)
	}
}
