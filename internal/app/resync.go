package app

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/replica"
	"github.com/presenced/presenced/internal/tracker"
)

// resyncer sends every watcher of the node what changed of what it
// watches when asked to (fanout.Hub.Resync: only users whose view differs
// from the last it was sent): after the node was cut off from NATS
// (changes of other nodes may have been missed) or the state store came
// back or lost its data (changes may have been lost with it). Requests that come while one is pending are
// one request; one that comes during a resync is served once more after
// it. Request is safe for concurrent use and never blocks.
type resyncer struct {
	requests  chan struct{} // capacity 1: a pending request
	notBefore atomic.Int64  // Unix ns before which the pending request does not read
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
		wait := max(settle, time.Until(time.Unix(0, r.notBefore.Load())))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
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

// missedChanges is the bus's cue that changes of other nodes may have been
// missed (cut off from NATS, or messages dropped): the watchers are sent
// what changed and the read replica is filled again.
func (a *App) missedChanges() {
	a.resync.Request()
	if a.replica != nil {
		// The reconnection this cue follows is answered: replicaFresh
		// may say yes again once the fill asked here is done.
		a.replicaReconnects.Store(a.nats.NC.Stats().Reconnects)
		a.replica.Refill()
	}
}

// mirrorLost is the bus's cue that changes on their way to the read
// replica were dropped (it fell behind): it is filled again.
func (a *App) mirrorLost() {
	if a.replica != nil {
		a.replica.Refill()
	}
}

// storeRecovered is the tracker's cue that the state store came back (or
// a part of it): what the watchers show, and the replica holds, may have
// been lost with it. Both read once the nodes claimed their devices again.
func (a *App) storeRecovered() {
	a.resync.RequestAfter(tracker.DefaultRecoverGrace)
	if a.replica != nil {
		a.replica.RefillAfter(tracker.DefaultRecoverGrace)
	}
}

// replicaFresh reports whether the read replica may answer now: this node
// hears the bus (and the bus has answered its last reconnection), its
// store takes every write (no outage buffer holds changes back), and
// every other node whose lease is alive was heard on the bus within
// replicaSilence — a node cut off from NATS but not from Redis makes
// changes the replica does not get until it is back. The replica's Run
// asks it every 250 ms as well as every read, so a silent node is
// noticed while nobody reads; once every node is heard again (or the
// silent one is gone) the replica is filled again before it answers.
func (a *App) replicaFresh() bool {
	if a.tracker == nil || a.beacon == nil || !a.nats.NC.IsConnected() || a.tracker.Degraded() {
		return false
	}
	if a.nats.NC.Stats().Reconnects != a.replicaReconnects.Load() {
		return false // reconnected, and the bus has not said so yet (missedChanges)
	}
	leases, _ := a.tracker.PeerLeases()
	now := a.cfg.Clock.Now()
	heard := make(map[uint64]time.Time, len(leases))
	for _, n := range a.beacon.Nodes() {
		heard[n.Lease] = n.Heard
	}
	timeout := a.tracker.LeaseTimeout().Milliseconds()
	for _, l := range leases {
		alive := !l.Taken && l.Since != 0 && now.UnixMilli()-l.Since < timeout
		if alive && now.Sub(heard[l.ID]) > replicaSilence {
			a.replicaDeaf.Store(true)
			return false
		}
	}
	if a.replicaDeaf.CompareAndSwap(true, false) {
		// Heard again: what it changed meanwhile may reach the bus late
		// or, if its queue overflowed, never. Fill again.
		a.replica.Refill()
		return false
	}
	return true
}

// replicaSilence is how long another live node may go unheard on the bus
// before the read replica stops answering: three beacons.
const replicaSilence = 3 * time.Second

// replicaMirror is the bus's Mirror for r (nil without a replica).
func replicaMirror(r *replica.Replica) func(*presence.Event) {
	if r == nil {
		return nil
	}
	return r.Publish
}
