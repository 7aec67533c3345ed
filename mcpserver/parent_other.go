//go:build !linux

package mcpserver

// watchParent watches nothing where there is no pidfd: the end of stdin
// alone says the client is gone.
func watchParent(gone func()) {}
