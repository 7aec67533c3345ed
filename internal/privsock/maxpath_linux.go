package privsock

// MaxPath is the longest path a unix socket address holds on Linux:
// sun_path is 108 bytes, one of them the terminating NUL.
const MaxPath = 107
