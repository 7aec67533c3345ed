//go:build darwin || freebsd

package privsock

// MaxPath is the longest path a unix socket address holds on macOS and
// FreeBSD: sun_path is 104 bytes, one of them the terminating NUL.
const MaxPath = 103
