// Package transport is how the controller reaches a host's agent-wrap:
// below the seam of package controller, which is a run's lifecycle on top
// of it.
//
// The one entry point is Host.Call: run this remote command line with
// these stdio, bounded by ctx (and Call.Timeout), and say how it ended
// (Result: the remote exit code, or lost with ssh's own words for why).
// Every call is `RSH [options] -- DEST LINE`, LINE made with Host.Remote
// (each word quoted for a POSIX shell: Quote); the client runs in a
// process group of its own and dies with the controller.
//
// Behind it, by file:
//   - remote.go: the host, its calls, their options (keepalives, -E logs)
//     and Quote / SplitCommand; sshopts.go, the options read from the rsh
//     words; sshconfig.go, the user's ssh configuration, `ssh -G DEST`
//     run at most once per rsh and destination in a process.
//   - mux.go (when to mux), muxslot.go (a call's session, the slot of its
//     master), muxticket.go (sessions counted across processes),
//     muxmaster.go (a master's start and stop), muxfiles.go (the mux
//     directory's files and locks), muxproto.go (a master's PID from
//     OpenSSH's mux protocol): agent-wrap's own ControlMasters.
//   - renewbatch.go: the renewals of the runs to one destination, batched
//     in one `renew --json ID...` session.
//   - clientgroup*.go, orphan*.go, linger*.go: a client's process group
//     killed when its call ends early (never once reaped), clients that
//     die with the controller, and a master that lingers after `ssh -O
//     exit`, killed by its recorded PID and start time.
//
// It knows nothing of a run's states or of the ledger: those are package
// controller's.
package transport
