module github.com/agent-wrap/agent-wrap

go 1.26.8

require (
	github.com/google/renameio/v2 v2.0.2
	github.com/spf13/pflag v1.1.0
	golang.org/x/crypto v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/rogpeppe/go-internal v1.16.0
	golang.org/x/tools v0.26.0 // indirect
)
