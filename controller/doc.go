// Package controller is the controller's half of agent-wrap's cancellation
// contract: it runs a job on another host through `ssh DEST agent-wrap ...`
// so that the run cannot be lost, and `agent-wrap ssh`, `ledger` and
// `settle` are thin faces over it.
//
// A runner written in Go calls Start, then Follow, calling Cancel from its
// signal handler; Settle answers later for any run a controller started,
// even one whose controller was killed.
//
//	run, err := controller.Start(cfg, argv) // ledger record on disk: launching
//	if err != nil { ... }                  // nothing was started
//	go func() { <-interrupted; run.Cancel() }()
//	code := run.Follow(ctx)                // the run's exit code, or 255
//
// What the calls guarantee:
//   - Start writes the run's ledger record (state launching) and syncs it
//     and its directory before it returns; it makes no connection. An error
//     means nothing was started and nothing written (a run ID already in the
//     ledger is ledger.ErrExists).
//   - Follow launches the run (`run --detach` and `attach` on one
//     connection), delivers the job's stdout and stderr to Config.Stdout and
//     Config.Stderr byte for byte, renews the lease over connections of its
//     own, and after a lost connection reattaches with `attach --from N,M`
//     from the byte counts it delivered: no byte lost, none twice. Every
//     change is in the ledger (synced) before Follow acts on it. It returns
//     the run's exit code as `run` gives it once the outcome is known (the
//     record then settled), or 255 when it is not: --give-up passed since
//     the last renewal that succeeded, or the host says unknown. A run left
//     unsettled is for Settle.
//   - The job's stdin is Config.Stdin, byte for byte, end of file included,
//     across reattaches: the host's wrapper counts what it wrote into the
//     job's pipe and skips what a reattach sends again; the controller keeps
//     the last Config.StdinKeep bytes it sent (64 MiB). Where the stream
//     cannot be resumed without a hole the host cancels the run with cause
//     stdin_lost (stdin.go). nil: /dev/null.
//   - A write to Config.Stdout or Config.Stderr that fails (the reader went
//     away) cancels the run, as ssh's SIGPIPE would; the ledger counts the
//     bytes written and says the reader went away (stdout_closed).
//   - Cancel records cancel_requested in the ledger (synced) before it
//     returns, and makes Follow send `cancel --wait` over a new connection
//     while the stream goes on delivering output up to the final record. It
//     never merely kills an ssh client.
//   - Inside a run (Config.Control, the job's AGENT_WRAP_CONTROL), Follow
//     first registers the run with the outer wrapper and exits 75 without
//     launching if it is refused; the lease is capped at the outer run's
//     time left and each renewal asked first; a cancel the outer wrapper
//     asks for is Cancel; the settled outcome is reported to it
//     (nested.go, package handoff).
//   - Settle asks the host (`reconcile --json`) about one unsettled run and
//     records the outcome; it never signals anything.
//
// Every remote call is `RSH [keepalives] [-E LOG] -- DEST LINE`, LINE being
// the remote agent-wrap command with every word quoted for a POSIX shell
// (see Quote), so the job's argv arrives exactly, and ssh's configuration
// (ControlMaster, ProxyJump, ports, identities) is the user's own. The
// keepalive options (ServerAliveInterval=10, ServerAliveCountMax=3) and -E
// (ssh's own messages to a log, never into the job's stderr) are added only
// when RSH is OpenSSH's ssh, and the keepalives only when the user set no
// ServerAliveInterval (in the RSH words or the ssh configuration files;
// `ssh -G DEST` when those cannot be followed).
//
// With Config.Mux auto (the default) and OpenSSH's ssh, unless the user set
// a ControlPath, ControlMaster or ProxyJump of their own, each call is a
// session on one of agent-wrap's own ControlMasters for the destination,
// and the runs' renewals are batched per destination as `renew --json
// ID...` (transport/mux.go, transport/renewbatch.go). `ssh -G DEST`, when
// asked at all, runs at most once per rsh and destination in a process.
//
// # Layers
//
// The package is a run's lifecycle on top of one call, the seam:
//
//   - Below it, package controller/transport: how a remote command line
//     reaches the host. transport.Host.Call runs one line with the stdio and
//     the time bound given and returns a transport.Result that says whether
//     the connection was lost, the remote exit code and ssh's own words for
//     why. Behind it: the calls' options and ssh logs (remote.go), the
//     user's ssh configuration (sshconfig.go), agent-wrap's ControlMasters
//     (mux*.go), the batched renewals (renewbatch.go), and the client
//     processes, their groups and their end with the controller
//     (clientgroup*.go, orphan*.go, linger*.go). It knows nothing of runs'
//     states or the ledger.
//   - Above it, this package: what to call and when, and what the answer
//     means. controller.go holds Start, Follow, Cancel and the state
//     machine's moves (state.go the transitions); launch.go and attach.go
//     the stream; renew.go, cancel.go, giveup.go and backoff.go the loops
//     beside it; outcome.go the judgment of a run's end; owner.go the
//     ledger writer; settle.go, show.go and verdict.go the calls for a run
//     another controller started. It starts no process itself.
//
// Inside, a run's state is one value moved by one transition function
// (state.go: launching, running, detached, cancel_requested, settling,
// settled; the ledger's state is its name), and what a run's end means for
// the ledger (outcome, exit code, cause, reason) is one rule for Follow's
// end, a launch that failed and Settle (judge, outcome.go).
package controller
