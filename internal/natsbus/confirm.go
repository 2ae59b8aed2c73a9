package natsbus

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Mark returns the number of the last event Publish accepted: every event
// published before the call (by any goroutine) is numbered at or below
// it. Wait(ctx, Mark()) waits until the stream has all of them. Safe for
// concurrent use; it allocates nothing.
func (b *Bus) Mark() uint64 { return b.q.accepted.Load() }

// waitPoll is how often Wait looks at the connection while it waits.
const waitPoll = 50 * time.Millisecond

// Wait waits until the stream acknowledged every event numbered up to
// mark (see Mark) and reports true. It reports false at once — and as
// soon as one of these happens while it waits — when the bus is not
// connected to NATS or closed, while the stream is known missing, or
// while its publishes are known failing (one failed since NATS last came
// back, and none was acknowledged since): the events wait for the
// publisher's retries and a crash would lose them, and callers waiting
// for each would be held up one after another until their ctx ended. It
// also reports false when ctx ends first. An event dropped because the
// queue was full (Stats.Dropped) is never acknowledged: Wait does not
// tell of it. Safe for concurrent use.
func (b *Bus) Wait(ctx context.Context, mark uint64) bool {
	var t *time.Timer
	for {
		if b.conf.done.Load() >= mark {
			return true
		}
		if b.shut.Load() || !b.nc.IsConnected() || b.streamMissing.Load() || b.failing() || ctx.Err() != nil {
			return false
		}
		ch := b.conf.waitChan()
		if b.conf.done.Load() >= mark {
			return true
		}
		if t == nil {
			t = time.NewTimer(waitPoll)
			defer t.Stop()
		} else {
			t.Reset(waitPoll)
		}
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// failing reports whether the stream's publishes are known failing: one
// failed, and none was acknowledged since, on the connection as it is
// now (once NATS is back the publisher sends them again at once: worth
// waiting for, until that fails too).
func (b *Bus) failing() bool {
	return b.failingSince.Load() != 0 && b.failedConn.Load() == b.nc.Stats().Reconnects
}

// confirmed follows the events the stream acknowledged: done is the
// highest number n such that every event up to n was acknowledged. Acks
// arrive in the order of sending, which is the order of numbers except
// for a publish sent again after a failure (it goes behind newer ones):
// the numbers acknowledged out of order wait in early until the gap
// below them closes. acked is called by the publisher only.
type confirmed struct {
	done  atomic.Uint64
	early map[uint64]struct{} // acknowledged above done+1; the publisher's

	mu      sync.Mutex    // guards ch and waited
	ch      chan struct{} // closed when done moves and someone waits
	waited  bool
	waiters atomic.Bool // ch was handed out since it was last closed
}

func (c *confirmed) acked(seq uint64) {
	d := c.done.Load()
	if seq != d+1 {
		if seq > d {
			if c.early == nil {
				c.early = map[uint64]struct{}{}
			}
			c.early[seq] = struct{}{}
		}
		return
	}
	d++
	for len(c.early) > 0 {
		if _, ok := c.early[d+1]; !ok {
			break
		}
		delete(c.early, d+1)
		d++
	}
	c.done.Store(d)
	c.wake()
}

// wake wakes the callers of Wait to look again.
func (c *confirmed) wake() {
	if c.waiters.Load() {
		c.mu.Lock()
		if c.waited {
			close(c.ch)
			c.ch, c.waited = nil, false
			c.waiters.Store(false)
		}
		c.mu.Unlock()
	}
}

// waitChan returns a channel closed the next time done moves.
func (c *confirmed) waitChan() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	c.waited = true
	c.waiters.Store(true)
	return c.ch
}
