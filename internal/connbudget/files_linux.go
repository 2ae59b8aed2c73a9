//go:build linux

package connbudget

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReserveFiles grows the process's table of file descriptors to hold n
// open files, up front, and reports the size it has. The kernel grows the
// table by doubling it as descriptors are opened, and in a process of
// several threads each growth waits for an RCU grace period while every
// other accept or dup waits for it: a burst of connections then has dozens
// of goroutines blocked in the kernel at once, and the Go runtime starts
// an OS thread for each of them, which it keeps. Grown at start, the table
// never grows under load. It costs the kernel about 8 bytes a slot.
func ReserveFiles(n int) (int, error) {
	n = min(n, int(min(FileLimit(), 1<<30)))
	if have := fdSize(); have >= n || n <= 1 {
		return have, nil
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return fdSize(), fmt.Errorf("reserve files: %w", err)
	}
	defer unix.Close(efd)
	// The lowest free descriptor from n-1 up: never one in use.
	fd, err := unix.FcntlInt(uintptr(efd), unix.F_DUPFD_CLOEXEC, n-1)
	if err != nil {
		return fdSize(), fmt.Errorf("reserve files: %w", err)
	}
	unix.Close(fd)
	return fdSize(), nil
}

// fdSize is the size of the process's descriptor table (FDSize in
// /proc/self/status), or 0 if it cannot be read.
func fdSize() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "FDSize:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
