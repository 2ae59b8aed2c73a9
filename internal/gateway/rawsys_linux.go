//go:build linux

package gateway

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The workers' reads, writes and epoll_ctl calls are raw system calls: their
// sockets are non-blocking, so each returns within microseconds, and a raw
// call keeps the worker's P instead of entering the scheduler's syscall
// state. Entered that way (as unix.Read does), a call the kernel happens
// to deschedule — common on a busy two-core machine — lets the runtime's
// monitor hand the P to a new OS thread, and with sixteen workers a node
// ends up holding dozens of threads it never gives back. Calls that may
// wait (epoll_wait, close) stay ordinary ones.

func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawSend writes p to the socket fd; MSG_NOSIGNAL: a client gone answers
// EPIPE, never SIGPIPE.
func rawSend(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
