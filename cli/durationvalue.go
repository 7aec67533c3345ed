package cli

import "github.com/agent-wrap/agent-wrap/internal/durflag"

// durationValue is a pflag value that takes a Go duration ("90s", "5m") or
// a bare number of seconds ("30", "0.5"); the MCP server's flags and tool
// arguments read durations the same way (internal/durflag).
type durationValue = durflag.Value
