package app

import (
	"context"
	"fmt"
	"time"

	"github.com/presenced/presenced/internal/beacon"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/peers"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// openBus connects to NATS, when configured, and opens the bus on it:
// this node's changes go out to the other nodes and the presence.changes
// stream; theirs come in to the hub (for the users its watchers watch),
// the room hub (the joins and leaves of the rooms its watchers watch, and
// the changes of their members), the read replica (all of them) and the
// contact relay.
func (a *App) openBus(ctx context.Context) error {
	if a.cfg.NATSURL == "" {
		return nil
	}
	name := "presenced"
	if a.cfg.NodeID != "" {
		name += " " + a.cfg.NodeID
	}
	nc, err := jsstream.Dial(a.cfg.NATSURL, name, a.cfg.Logger.With("component", "nats"), natsbus.JetStreamOptions()...)
	if err != nil {
		return err
	}
	a.nats = nc
	a.add(part{close: noErr(nc.Close)})
	bc := natsbus.Config{
		Conn:              nc,
		NodeID:            a.cfg.NodeID,
		Local:             busLocal{a.hub, a.rooms},
		Rooms:             a.rooms,
		OnContactsChanged: a.otherNodesContacts,
		OnReconnect:       a.missedChanges,
		OnMirrorLost:      a.mirrorLost,
		Logger:            a.cfg.Logger,
	}
	if a.replica != nil {
		bc.Mirror = a.replica.Publish
	}
	if a.bus, err = natsbus.Open(ctx, bc); err != nil {
		return fmt.Errorf("open the NATS bus: %w", err)
	}
	a.hub.SetInterest(a.bus)   // the bus subscribes to what the hub's watchers watch
	a.rooms.SetInterest(a.bus) // and to the watched rooms and their members
	a.stats.Bus = a.bus.Stats
	a.add(part{run: a.bus.Run, stop: stopBus, close: a.bus.Close, publish: a.bus,
		check: httpapi.Check{Name: "nats", Shared: true, Check: a.natsReady}})
	return nil
}

// busLocal is the bus's Local: the users this node watches — on its
// sockets (the hub) and as members of the rooms watched here (the room
// hub) — and where another node's change of one goes: to both, each
// taking what its watchers watch.
type busLocal struct {
	hub   *fanout.Hub
	rooms *fanout.RoomHub
}

func (l busLocal) Publish(ev *presence.Event) {
	l.hub.Publish(ev)
	l.rooms.Publish(ev)
}

func (l busLocal) Watched(user string) bool {
	return l.hub.Watched(user) || l.rooms.MemberWatched(user)
}

// otherNodesContacts is the bus's cue that another node changed owner's
// contact list (so it is not announced again). The hub's watchers of
// owner are shown what the list lets them see now; the room hub reads a
// member's list with each of its events, and needs nothing.
func (a *App) otherNodesContacts(owner string) {
	if a.hub.Watched(owner) {
		a.contacts.Changed(owner)
	}
}

// natsReady is the readiness check of NATS: it answers, and the changes
// stream takes this node's changes (states stream_missing and
// stream_behind otherwise: docs/operations.md, "Readiness").
func (a *App) natsReady(ctx context.Context) error {
	if err := a.bus.Ping(ctx); err != nil {
		return err
	}
	switch h := a.bus.Stream(); {
	case h.Missing:
		return &httpapi.StateError{State: "stream_missing", Err: fmt.Errorf(
			"the changes stream is missing and cannot be created again; %d changes of this node wait", h.Waiting)}
	case h.Unacked > 0:
		return &httpapi.StateError{State: "stream_behind", Err: fmt.Errorf(
			"the changes stream has acknowledged none of this node's changes for %v; %d wait", h.Unacked.Round(time.Millisecond), h.Waiting)}
	}
	return nil
}

// openBeacon opens, with NATS and Redis, the node's beacon — nodes cut
// off from Redis only keep their devices: their beacons on NATS keep the
// others from taking them over — and the peers a degraded read asks what
// they hold of its users' devices.
func (a *App) openBeacon(context.Context) error {
	if a.bus == nil || a.redis == nil {
		return nil
	}
	var err error
	if a.beacon, err = beacon.New(beacon.Config{
		Conn:     a.nats,
		Interval: tracker.DefaultLeaseInterval(a.rules.TTL),
		Timeout:  tracker.DefaultLeaseTimeout(a.rules.TTL),
		Name:     a.bus.NodeID(), // -node-id, or the bus's random one
		Clock:    a.cfg.Clock,
		Logger:   a.cfg.Logger.With("component", "beacon"),
	}); err != nil {
		return fmt.Errorf("node beacon on NATS: %w", err)
	}
	a.add(part{run: quiet(func(ctx context.Context) error { return a.beacon.Run(ctx, a.tracker.LeaseID) }), stop: stopBus})
	if a.peers, err = peers.New(peers.Config{
		Conn:   a.nats,
		Live:   a.beacon.Live,
		Clock:  a.cfg.Clock,
		Logger: a.cfg.Logger.With("component", "peers"),
	}); err != nil {
		return err
	}
	a.stats.Peers = a.peers.Stats
	a.add(part{run: a.servePeers, stop: stopBus})
	return nil
}

// servePeers answers other nodes' questions from the tracker.
func (a *App) servePeers(ctx context.Context) error {
	if err := a.peers.Serve(ctx, a.tracker); err != nil {
		a.log.Warn("answering other nodes' questions stopped", "err", err)
	}
	return nil
}
