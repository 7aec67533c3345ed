//go:build !linux

package httpgw

// NoDump does nothing where there is no PR_SET_DUMPABLE; the controller
// reads a secret there only to send it over its launch connection.
func NoDump() error { return nil }
