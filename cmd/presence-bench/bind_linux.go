//go:build linux

package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindNoPort lets a socket bound to a source address take its port at
// connect time (IP_BIND_ADDRESS_NO_PORT): bind with port 0 would pick a
// port unused on every address, which slows to a crawl once ~10,000 ports
// are taken, and caps all source addresses together at the ephemeral range.
func bindNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); err != nil {
		return err
	}
	return serr
}
