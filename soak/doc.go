// Package soak holds agent-wrap's reliability tests: the real binary under
// faults (the wrapper SIGKILLed at random moments, a run root that fills
// up), bad input (hostile run-directory layouts), load (hundreds of
// concurrent runs driven from several clients) and secrets in the
// environment. Each test runs a small count in `go test ./...` and the full
// count under `make soak` (AGENT_WRAP_SOAK=1); README.md lists them and the
// counts. The package has no code of its own: only this doc and tests.
package soak
