//go:build linux

package gateway

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
)

// threads is the number of OS threads of this process.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// A poller's two loops wait for their epoll instances through the
// runtime's poller: waiting, they hold goroutines, not OS threads. (A
// loop blocked in epoll_wait holds a thread for as long as it waits, so
// sixteen pollers would hold 32.)
func TestPollersWaitWithoutThreads(t *testing.T) {
	const pollers = 16
	before := threads(t)
	var ps []poller
	for range pollers {
		g := &Gateway{cfg: Config{Workers: 1}, log: slog.New(slog.DiscardHandler), clock: clock.Real{}, conns: map[uint64]*conn{}}
		p, err := newPoller(g)
		if err != nil {
			t.Fatal(err)
		}
		p.start()
		ps = append(ps, p)
	}
	// Every loop waits within this; a loop blocked in epoll_wait would
	// hold its thread from then on.
	time.Sleep(200 * time.Millisecond)
	grown := threads(t) - before
	for _, p := range ps {
		p.stop()
	}
	if grown >= pollers {
		t.Fatalf("%d pollers waiting took %d more OS threads", pollers, grown)
	}
	t.Logf("%d pollers waiting: %d more OS threads", pollers, grown)
}
