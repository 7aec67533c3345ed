package chaos

import (
	"fmt"
	"os/exec"
	"os/user"
)

// EnsureUser makes sure the system user name exists (useradd --system, no
// home, no login shell), for the runs without a cgroup. It is left in place
// afterwards: two campaigns (or a campaign and the tests) can run at once,
// and one must not delete the account the other's runs are using.
func EnsureUser(name string) error {
	if _, err := user.Lookup(name); err == nil {
		return nil
	}
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		if _, lerr := user.Lookup(name); lerr == nil {
			return nil // another campaign added it meanwhile
		}
		return fmt.Errorf("useradd %s: %v: %s", name, err, out)
	}
	return nil
}
