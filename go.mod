module github.com/agent-wrap/agent-wrap

go 1.26.8

require (
	github.com/google/renameio/v2 v2.0.2
	github.com/jackc/pgx/v5 v5.13.0
	github.com/spf13/pflag v1.1.0
	golang.org/x/crypto v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	golang.org/x/text v0.44.0 // indirect
)

require (
	github.com/rogpeppe/go-internal v1.16.0
	golang.org/x/tools v0.52.0 // indirect
)
