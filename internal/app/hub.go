package app

import (
	"context"
	"time"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
)

// openHub builds the fan-out hub (who on this node watches whom), with
// what keeps its watchers right: the relay of changed contact lists and
// the resyncer, which sends them the current state when changes may have
// been missed.
func (a *App) openHub(context.Context) error {
	var err error
	a.hub, err = fanout.New(fanout.Config{
		Relations:        a.durable,
		MaxSubscriptions: a.cfg.MaxSubscriptions,
		AsyncThreshold:   a.cfg.FanoutAsyncThreshold,
		Logger:           a.cfg.Logger.With("component", "fanout"),
	})
	if err != nil {
		return err
	}
	a.stats.Hub = a.hub.Stats
	a.add(part{run: quiet(a.hub.Run), stop: stopLast, publish: a.hub})
	a.contacts = newContactRelay(a.durable, a.hub, a.userState, a.cfg.Logger)
	a.resync = newResyncer(a.cfg.Logger)
	a.add(part{run: a.runResync, stop: stopLast})
	return nil
}

// runResync serves the resyncer's requests: the watchers are read again
// through the reader, and the rooms' watchers sent fresh snapshots,
// unless the tracker reads a fallback now (the store is down; its
// recovery asks again).
func (a *App) runResync(ctx context.Context) error {
	a.resync.Run(ctx, a.hub, a.rooms, a.reader.Read, func() bool { return a.tracker.Stats().Down }, a.rejoinRooms)
	return nil
}

// rejoinRooms joins again the rooms this node's connections joined
// (gateway.RejoinRooms), after the state store lost them.
func (a *App) rejoinRooms(ctx context.Context) {
	if a.gw == nil {
		return
	}
	start := time.Now()
	n, err := a.gw.RejoinRooms(ctx)
	if err != nil {
		a.log.Warn("joining the connections' rooms again after the state store recovered: some failed (their clients' next reconnect joins them)",
			"joined", n, "err", err)
		return
	}
	if n > 0 {
		a.log.Info("the connections' rooms joined again after the state store recovered", "joins", n,
			"took", time.Since(start).Round(time.Millisecond))
	}
}

// contactsChanged is the HTTP API's cue that owner's contact list changed
// on this node. The tracker first stamps the owner a new version
// (Tracker.ContactsChanged), so the views the hubs then send are above
// everything their watchers had; then this node's hub is told, and with
// NATS the other nodes, which read the list again.
func (a *App) contactsChanged(owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.tracker.ContactsChanged(ctx, owner); err != nil {
		a.log.Warn("stamping a version for a changed contact list failed; watchers who lost sight may keep the last status they were sent",
			"user_id", owner, "err", err)
	}
	a.contacts.Changed(owner)
	if a.bus != nil {
		a.bus.ContactsChanged(owner)
	}
}

// userState reads one user's state now, for the hub's views of a user
// whose contact list changed.
func (a *App) userState(ctx context.Context, user string) (presence.Snapshot, error) {
	var s [1]presence.Snapshot
	err := a.tracker.Get(ctx, a.tracker.Now(), []string{user}, s[:])
	return s[0], err
}
