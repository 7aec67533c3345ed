// Package mcpserver is `agent-wrap mcp`: the controller (package
// controller, the same code `agent-wrap ssh` runs) with an AI agent's
// tools in front, served over the Model Context Protocol on stdio with the
// official Go SDK. Only cmd/agent-wrap-mcp links it: the SDK costs about
// 2.6 MiB of binary and 3 MiB of start memory that agent-wrap must not pay.
//
// What the server guarantees:
//   - Every tool call is refused, as a tool result with isError, unless
//     --allow was given; a run's destination must match an --allow pattern
//     (a shell glob). Bad arguments (no command, both argv and command, an
//     unreadable lease) are refused before a ledger record is written or a
//     host contacted.
//   - `run` is controller.Start (the ledger's launching record, synced,
//     before the first connection) then Follow, which the server drives
//     until the run is settled, whatever the calls that look at it do. The
//     job's output is kept in files of the server's own (a private
//     directory removed when the server exits), byte for byte as the host
//     wrote it: `logs` reads them by the host's byte offsets.
//   - A `run` or `wait` request the client cancels (notifications/cancelled)
//     is controller.Run.Cancel: cancel_requested in the ledger, the remote
//     `cancel --wait` over a new connection, and the request is answered
//     only once the run is settled. `cancel` is the same as a tool.
//   - When the client goes away (stdin closed, or on Linux the process
//     that started the server gone, seen through a pidfd) or the
//     server is sent INT, TERM or HUP, every run it started that is still
//     live is cancelled and each cancel confirmed before the server exits
//     (--on-exit keep: they are left to their leases, and `agent-wrap
//     settle` learns their outcomes later).
//   - Nothing is written to stdout but the protocol: the controller's own
//     words go to stderr, prefixed "agent-wrap-mcp: ".
//
// Not guaranteed: the output of a run this server did not start (`logs` of
// it is refused, naming the host's own `agent-wrap logs`).
package mcpserver
