package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/presenced/presenced/internal/fanout"
)

// resyncer sends every watcher of the node the current state of what it
// watches when asked to: after the node was cut off from NATS (changes of
// other nodes may have been missed) or the state store came back (changes
// may have been lost with it). Requests that come while one is pending are
// one request; one that comes during a resync is served once more after
// it. Request is safe for concurrent use and never blocks.
type resyncer struct {
	requests chan struct{} // capacity 1: a pending request
	log      *slog.Logger
}

// settle is how long a request waits before the resync reads: the
// reconnection's subscriptions and the store's replay finish meanwhile.
const settle = 200 * time.Millisecond

func newResyncer(log *slog.Logger) *resyncer {
	return &resyncer{requests: make(chan struct{}, 1), log: log}
}

// Request asks for a resync.
func (r *resyncer) Request() {
	select {
	case r.requests <- struct{}{}:
	default: // one is pending already
	}
}

// Run serves requests until ctx is done: hub is resynchronised through
// read, unless down says reads come from a fallback now (the store is
// down; its recovery asks again).
func (r *resyncer) Run(ctx context.Context, hub *fanout.Hub, read fanout.ReadFunc, down func() bool) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.requests:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(settle):
		}
		if down() {
			continue
		}
		start := time.Now()
		if err := hub.Resync(ctx, read); err != nil {
			return
		}
		r.log.Info("watchers resynchronised", "took", time.Since(start).Round(time.Millisecond))
	}
}
