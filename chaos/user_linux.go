package chaos

import (
	"fmt"
	"os/exec"
	"os/user"
)

// EnsureUser makes sure the system user name exists (useradd --system, no
// home, no login shell) for the runs without a cgroup, and returns a
// function that removes it again if this call created it.
func EnsureUser(name string) (remove func(), err error) {
	if _, err := user.Lookup(name); err == nil {
		return func() {}, nil
	}
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("useradd %s: %v: %s", name, err, out)
	}
	return func() { exec.Command("userdel", name).Run() }, nil
}
