package httpgw

import (
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

func readlink(path string, buf []byte) (int, error) { return unix.Readlink(path, buf) }

func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
