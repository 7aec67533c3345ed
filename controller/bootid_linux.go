package controller

import "github.com/agent-wrap/agent-wrap/proc"

// localBootID is this machine's boot ID, for Self: the kernel's
// (/proc/sys/kernel/random/boot_id), "" if it cannot be read.
func localBootID() string {
	id, _ := proc.BootID()
	return id
}
