package tracker

import "github.com/presenced/presenced/internal/presence"

// Stats are the tracker's counters since start.
type Stats struct {
	Heartbeats  uint64
	Transitions map[[2]presence.Status]uint64 // [prev, next] → count
	TextChanges uint64
	RoomEvents  uint64 // joins and leaves of rooms published
	// Online counts users whose public status is not offline, from the
	// transitions this tracker made: exact when it makes every transition
	// of its store (a store in this process), not when nodes share the
	// store (each sees only its own share of arrivals and departures).
	Online      int64
	Flushed     uint64 // last_seen checkpoints written
	FlushErrors uint64

	Down          bool   // the state store is down (or its outage buffer is being replayed)
	Outages       uint64 // times the state store went down
	Buffered      int64  // users with operations in the outage buffer
	Replayed      uint64 // users whose buffered operations were replayed
	StaleReplays  uint64 // of those, users whose last replayed change was over by the replay (not published)
	StoreResets   uint64 // times the state store was found to have lost its data (versions moved to a new epoch)
	DegradedReads uint64 // Get calls answered without the state store
	PartsDown     int    // parts of a Partitioned store (Cluster masters' shards) down now, their users' writes buffered
	PartOutages   uint64 // times a part was found down
	PeerSigns     uint64 // signs of devices other nodes gave degraded reads (Config.Peers)
	PeerSnapshots uint64 // users other nodes read in the store for degraded reads
	PeerAskErrors uint64 // degraded reads that could ask no other node

	AwaitingProfile int64  // users whose heartbeats wait in this node for the durable store
	ProfilesLoaded  uint64 // of those, users loaded once it answered

	OwnedDevices   int    // devices whose sockets this node holds and owns ; 0 without leases
	LeaseLosses    uint64 // times this node found its lease taken over or lost, and claimed its devices again
	LeaseTakeovers uint64 // leases of other nodes this node marked and took over
}

// Stats returns a copy of the counters.
func (t *Tracker) Stats() Stats {
	s := Stats{
		Heartbeats:  t.beats.load(),
		Transitions: make(map[[2]presence.Status]uint64),
		TextChanges: t.events.textChanges.Load(),
		RoomEvents:  t.events.roomEvents.Load(),
		Online:      t.events.online.Load(),
		Flushed:     t.cps.flushed.Load(),
		FlushErrors: t.cps.failed.Load(),

		Down:          !t.link.up(),
		Outages:       t.link.outages.Load(),
		Buffered:      t.outage.users(),
		Replayed:      t.outage.replayed.Load(),
		StaleReplays:  t.outage.staleReplays.Load(),
		StoreResets:   t.floors.resets.Load(),
		DegradedReads: t.degradedReads.Load(),

		AwaitingProfile: t.cold.buf.n.Load(),
		ProfilesLoaded:  t.cold.loaded.Load(),
	}
	if c := t.link.can.beatCounter; c != nil {
		s.Heartbeats += c.Beats()
	}
	if t.peers != nil {
		s.PeerSigns = t.peers.signs.Load()
		s.PeerSnapshots = t.peers.snapshots.Load()
		s.PeerAskErrors = t.peers.askErrors.Load()
	}
	if t.lease != nil {
		s.OwnedDevices = t.owned.held()
		s.LeaseLosses = t.lease.losses.Load()
		s.LeaseTakeovers = t.lease.takeovers.Load()
	}
	if t.link.parts != nil {
		s.PartsDown = int(t.link.parts.down.Load())
		s.PartOutages = t.link.parts.outages.Load()
	}
	for p := range t.events.transitions {
		for n := range t.events.transitions[p] {
			if c := t.events.transitions[p][n].Load(); c > 0 {
				s.Transitions[[2]presence.Status{presence.Status(p), presence.Status(n)}] = c
			}
		}
	}
	return s
}
