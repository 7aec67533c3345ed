package cli

import "github.com/agent-wrap/agent-wrap/rundir"

// checkIDs prints why the first of ids that is no run ID is not, and
// returns ExitUsage; 0 when all are run IDs.
func (e *Env) checkIDs(ids ...string) int {
	for _, id := range ids {
		if err := rundir.ValidID(id); err != nil {
			e.errorf("%v", err)
			e.hint("run IDs match %s", rundir.IDPattern)
			return ExitUsage
		}
	}
	return 0
}
