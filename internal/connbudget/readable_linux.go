package connbudget

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// readable reports whether bytes the client sent wait in nc's receive
// queue, unread by the node.
func readable(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}
