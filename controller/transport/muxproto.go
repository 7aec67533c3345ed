package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// masterPID asks the ControlMaster at path for its PID, as `ssh -O check`
// does, in OpenSSH's multiplexing protocol (its PROTOCOL.mux): a hello
// each way (version 4), then MUX_C_ALIVE_CHECK, answered by MUX_S_ALIVE
// with the master's PID. Spoken here rather than by starting `ssh -O
// check`: on a machine loaded by hundreds of runs a process start took
// seconds, during which the master's slot still counted as being started
// and no other master could be.
func masterPID(path string, timeout time.Duration) (int, error) {
	const (
		muxHello      = 0x00000001
		muxAliveCheck = 0x10000004
		muxAlive      = 0x80000005
		muxVersion    = 4
	)
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	msg := func(words ...uint32) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(4*len(words)))
		for _, w := range words {
			b = binary.BigEndian.AppendUint32(b, w)
		}
		return b
	}
	const rid = 1
	if _, err := c.Write(append(msg(muxHello, muxVersion), msg(muxAliveCheck, rid)...)); err != nil {
		return 0, err
	}
	read := func() ([]byte, error) {
		var n [4]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return nil, err
		}
		size := binary.BigEndian.Uint32(n[:])
		if size < 4 || size > 1<<16 {
			return nil, fmt.Errorf("mux: a message of %d bytes", size)
		}
		b := make([]byte, size)
		_, err := io.ReadFull(c, b)
		return b, err
	}
	for i := 0; i < 4; i++ {
		b, err := read()
		if err != nil {
			return 0, err
		}
		switch binary.BigEndian.Uint32(b) {
		case muxHello:
			continue
		case muxAlive:
			if len(b) < 12 || binary.BigEndian.Uint32(b[4:]) != rid {
				return 0, errors.New("mux: a malformed alive answer")
			}
			return int(binary.BigEndian.Uint32(b[8:])), nil
		default:
			return 0, fmt.Errorf("mux: answer type %#x to an alive check", binary.BigEndian.Uint32(b))
		}
	}
	return 0, errors.New("mux: no alive answer")
}
