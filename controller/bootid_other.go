//go:build !linux

package controller

// localBootID is "" off Linux: with no boot ID, a controller's runs are
// judged by their heartbeats even on the machine itself (ledger.Owner.
// SameMachine needs one), which is right, only slower to call a dead owner
// gone (its give-up time, not its PID).
func localBootID() string { return "" }
