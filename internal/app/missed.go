package app

import (
	"time"

	"github.com/presenced/presenced/internal/tracker"
)

// missedChanges is the bus's cue that changes of other nodes may have been
// missed (cut off from NATS, or messages dropped): the watchers are sent
// what changed, the rooms' watchers fresh snapshots (resyncer), and the
// read replica is filled again.
func (a *App) missedChanges() {
	a.resync.Request()
	if a.replica != nil {
		// The fill first: replicaFresh may say yes again once it is done,
		// not in between.
		a.replica.Refill()
		// The reconnection this cue follows is answered.
		a.replicaReconnects.Store(a.nats.NC.Stats().Reconnects)
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
// a part of it): what the watchers show, the rooms the connections
// joined, and what the replica holds may have been lost with it. The
// rooms are joined again and the others read once the nodes claimed their
// devices again.
func (a *App) storeRecovered() {
	a.resync.RequestRejoin(tracker.DefaultRecoverGrace)
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
			// A node never heard yet is one that just started (its lease
			// comes before its first beacon): not worth a warning.
			if !a.replicaDeaf.Swap(true) && !heard[l.ID].IsZero() {
				a.cfg.Logger.Warn("a live node is not heard on NATS: status reads go to Redis until it is, and the read replica is filled again then",
					"lease", l.ID, "silent", now.Sub(heard[l.ID]).Round(time.Millisecond))
			}
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
