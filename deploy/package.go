package deploy

import "path/filepath"

// The watchdog's units as a package ships them (`make package`), rendered
// from the same units/ files install writes: the package's binary in
// ExecStart, and the run root systemd's %h names, so one unit serves every
// user. Packaged units are never enabled by the package itself; its
// post-install message says how (PackageEnable).

// Where a package puts the system and the user units: the directories of
// the distribution's own units, which systemd searches whatever the local
// administrator has in /etc/systemd.
const (
	PackageSystemUnitDir = "/usr/lib/systemd/system"
	PackageUserUnitDir   = "/usr/lib/systemd/user"
)

// PackageRunRoot is the run root the packaged watchdog watches: the default
// run root ($HOME/.agent-runs) of the user the service runs as. systemd
// expands %h to that user's home: /root for the system units, each user's
// own home for the user units.
const PackageRunRoot = "%h/.agent-runs"

// PackageUnits renders the three units twice, system and user, running bin.
// Paths are where the package installs them.
func PackageUnits(bin string) ([]File, error) {
	var files []File
	for _, user := range []bool{false, true} {
		dir := PackageSystemUnitDir
		if user {
			dir = PackageUserUnitDir
		}
		d := unitData{Bin: bin, Root: PackageRunRoot, User: user, Package: true}
		for _, name := range []string{ServiceUnit, OnceServiceUnit, TimerUnit} {
			b, err := render(name, d)
			if err != nil {
				return nil, err
			}
			files = append(files, File{Path: filepath.Join(dir, name), Perm: 0o644, Data: b})
		}
	}
	return files, nil
}

// PackageEnable is what the package's post-install message tells the
// administrator: the ways to start the packaged watchdog, each a command
// line and what it is for.
var PackageEnable = [][2]string{
	{"systemctl enable --now " + ServiceUnit, "root's runs (/root/.agent-runs)"},
	{"systemctl --global enable " + ServiceUnit, "every user's runs, from their next login"},
	{"systemctl --user enable --now " + ServiceUnit, "one user's runs, run as that user"},
	{"loginctl enable-linger USER", "keeps USER's watchdog running while logged out"},
}

// PackageEnableNote follows PackageEnable in the message.
const PackageEnableNote = TimerUnit + " instead of " + ServiceUnit + " makes one pass a minute; enable one of the two, never both"
