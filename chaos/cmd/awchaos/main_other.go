//go:build !linux

// Command awchaos runs agent-wrap's seeded fault campaign; the campaign
// plays the host side, which is Linux only.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "awchaos: the fault campaign plays the host side, which runs on Linux only")
	os.Exit(2)
}
