package tracker

import (
	"sync"
	"time"
)

// # Close deadlines on time
//
// A device whose socket closed without a bye ends at the close plus the
// close grace. The sweep ticker (SweepInterval) would apply that deadline
// up to one interval late, so the tracker also keeps the close deadlines
// it made itself (Disconnect: devices this node holds and devices of an
// embedded store) and Run arms one timer, on the tracker's clock, for the
// earliest of them: when it fires, Run sweeps at once.
//
// The deadlines are kept in a ring, in order, rounded up to a quantum
// (at least 1 ms, more for a long grace, so that one grace's worth of
// closes fits the ring): one entry per quantum however many devices close
// in it, never more than closeRing entries. The grace is the same for
// every close, so a new deadline is almost always the latest (one made
// out of order by a concurrent close is put in place). Should the ring be
// full, the deadline is left to the sweep ticker. Devices this node does
// not close (an HTTP device, another node's) end by the sweep ticker, as
// before.

// closeRing bounds the close deadlines kept for the timer.
const closeRing = 2048

// closeTimer is the close deadlines waiting for Run's timer. It is safe
// for concurrent use.
type closeTimer struct {
	quantum int64         // ms; deadlines are rounded up to a multiple of it
	kick    chan struct{} // capacity 1: a new earliest deadline, for Run to re-arm

	mu   sync.Mutex // guards the fields below
	ring [closeRing]int64
	head int // index of the earliest deadline
	n    int // deadlines held
}

// newCloseTimer returns the deadlines of closes with grace g.
func newCloseTimer(g time.Duration) *closeTimer {
	q := max(int64(1), g.Milliseconds()/(closeRing/2))
	return &closeTimer{quantum: q, kick: make(chan struct{}, 1)}
}

// add records a close deadline at (Unix ms) and has Run re-arm its timer
// if it is the earliest.
func (c *closeTimer) add(at int64) {
	if r := at % c.quantum; r != 0 {
		at += c.quantum - r
	}
	c.mu.Lock()
	earliest, ok := c.insertLocked(at)
	c.mu.Unlock()
	if ok && earliest {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// insertLocked puts at in order, unless it is held already or the ring
// is full, and reports whether it is now the earliest and whether it was
// put.
func (c *closeTimer) insertLocked(at int64) (earliest, ok bool) {
	i := c.n // position of at: after every deadline before it
	for i > 0 && c.ring[(c.head+i-1)%closeRing] >= at {
		if c.ring[(c.head+i-1)%closeRing] == at {
			return false, false
		}
		i--
	}
	if c.n == closeRing {
		return false, false
	}
	for j := c.n; j > i; j-- {
		c.ring[(c.head+j)%closeRing] = c.ring[(c.head+j-1)%closeRing]
	}
	c.ring[(c.head+i)%closeRing] = at
	c.n++
	return i == 0, true
}

// next drops the deadlines at or before now (the sweep about to run
// applies them) and returns the earliest left, 0 if none.
func (c *closeTimer) next(now int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.n > 0 && c.ring[c.head] <= now {
		c.head = (c.head + 1) % closeRing
		c.n--
	}
	if c.n == 0 {
		return 0
	}
	return c.ring[c.head]
}

// earliest returns the earliest deadline held, 0 if none.
func (c *closeTimer) earliest() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return 0
	}
	return c.ring[c.head]
}
