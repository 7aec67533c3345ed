package membership

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agent-wrap/agent-wrap/cgroup"
)

// Boundaries recorded in status.json (`boundary`): what contains the run.
const (
	// BoundarySubreaper: the job's session, and its wrapper as the
	// subreaper of every descendant.
	BoundarySubreaper = "session+subreaper"
	// BoundaryCgroup: a cgroup v2 of the run's own, named CgroupName.
	BoundaryCgroup = "cgroup"
)

// CgroupName is the name of a run's cgroup (below cgroup.Parent in its
// wrapper's own cgroup): RUN_ID.WRAPPER_PID. A run ID never holds a '/', so
// the name is one path element, and the run ID is everything before its
// last dot.
func CgroupName(runID string, wrapperPID int) string {
	return runID + "." + strconv.Itoa(wrapperPID)
}

// runOfCgroup returns the run ID and wrapper PID a run cgroup's name
// encodes, or ok false when name is not one.
func runOfCgroup(name string) (id string, wrapperPID int, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i <= 0 {
		return "", 0, false
	}
	pid, err := strconv.Atoi(name[i+1:])
	if err != nil || pid <= 1 {
		return "", 0, false
	}
	return name[:i], pid, true
}

// cgroupOf is cgroup.Of: pid's cgroup v2 directory, or "".
func cgroupOf(pid int) string { return cgroup.Of(pid) }

// runCgroupOf returns the run cgroup pid is in when it is the one its
// wrapper made for the run named name (see CgroupName, cgroup.Valid), else
// "".
func runCgroupOf(pid int, name string) string {
	p := cgroupOf(pid)
	if p != "" && filepath.Base(p) == name && cgroup.Valid(p) {
		return p
	}
	return ""
}
