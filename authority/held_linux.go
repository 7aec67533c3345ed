package authority

import "github.com/agent-wrap/agent-wrap/statusfile"

// DecideHeld is Decide for a caller that already holds the run's lock
// (rundir.Dir.Lock on g.Dir) and has read the record under it: rec, or the
// read's error readErr. `authorize` finds the run with membership.Find,
// which hands back the directory it opened, locked, and the record it
// judged the caller by; so the answer costs one open of the run directory
// and one read of status.json. The guarantees are Decide's: the lock is
// the one intents are recorded under, and the record is read under it.
func (g Gate) DecideHeld(a Action, rec *statusfile.Record, readErr error) (Decision, error) {
	return g.decide(a, rec, readErr)
}
