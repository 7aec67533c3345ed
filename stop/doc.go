// Package stop stops what is left of a run from outside its wrapper: the
// ordered stop that cancel and the watchdog perform when the wrapper is gone
// or has not acted. Which processes are the run's is membership's answer;
// this package only acts on it.
//
// Before any signal the intent is journaled and synced and `cancelling`
// written under the run's lock. Each member is then signalled through a
// pidfd after its identity is checked (see stop.Signal), so a recycled PID
// never receives a signal.
package stop
