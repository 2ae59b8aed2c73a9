package app

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/fanout"
)

// resyncer sends every watcher of the node what changed of what it
// watches when asked to (fanout.Hub.Resync: only users whose view differs
// from the last it was sent; fanout.RoomHub.Resync: a fresh snapshot of
// every watched room, read by the room hub's worker as after a version
// gap): after the node was cut off from NATS
// (changes of other nodes may have been missed) or the state store came
// back or lost its data (changes may have been lost with it). Requests that come while one is pending are
// one request; one that comes during a resync is served once more after
// it. Request is safe for concurrent use and never blocks.
type resyncer struct {
	requests  chan struct{} // capacity 1: a pending request
	notBefore atomic.Int64  // Unix ns before which the pending request does not read
	rejoin    atomic.Bool   // the pending request rejoins the rooms first (RequestRejoin)
	log       *slog.Logger
}

// settle is how long a request waits before the resync reads: the
// reconnection's subscriptions and the store's replay finish meanwhile.
const settle = 200 * time.Millisecond

func newResyncer(log *slog.Logger) *resyncer {
	return &resyncer{requests: make(chan struct{}, 1), log: log}
}

// Request asks for a resync.
func (r *resyncer) Request() { r.RequestAfter(0) }

// RequestAfter asks for a resync that reads no earlier than d from now:
// after the state store came back, every node first claims again the
// devices it holds (a store that came back empty lost them), and a
// resync that read before would show them offline.
func (r *resyncer) RequestAfter(d time.Duration) {
	at := time.Now().Add(d).UnixNano()
	for {
		cur := r.notBefore.Load()
		if cur >= at || r.notBefore.CompareAndSwap(cur, at) {
			break
		}
	}
	select {
	case r.requests <- struct{}{}:
	default: // one is pending already
	}
}

// RequestRejoin asks for a resync after d that first joins again the
// rooms the node's connections joined: the state store lost its data (or
// this node's lease), so what it held of their rooms may be gone.
func (r *resyncer) RequestRejoin(d time.Duration) {
	r.rejoin.Store(true)
	r.RequestAfter(d)
}

// Run serves requests until ctx is done: hub is resynchronised through
// read, and rooms' watchers are sent fresh snapshots, unless down says
// reads come from a fallback now (the store is down; its recovery asks
// again).
func (r *resyncer) Run(ctx context.Context, hub *fanout.Hub, rooms *fanout.RoomHub, read fanout.ReadFunc, down func() bool,
	rejoin func(context.Context)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.requests:
		}
		wait := max(settle, time.Until(time.Unix(0, r.notBefore.Load())))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if down() {
			continue
		}
		if r.rejoin.Swap(false) && rejoin != nil {
			rejoin(ctx)
		}
		rooms.Resync() // does not wait: the room hub's worker reads
		start := time.Now()
		if err := hub.Resync(ctx, read); err != nil {
			return
		}
		r.log.Info("watchers resynchronised", "took", time.Since(start).Round(time.Millisecond))
	}
}
