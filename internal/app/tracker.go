package app

import (
	"context"
	"log/slog"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// openTracker builds the tracker over the stores: every change it makes
// (and every room event) is logged at debug level, then handed to each
// part that publishes, in the order they opened.
func (a *App) openTracker(context.Context) error {
	pubs := publishers{logPublisher{a.cfg.Logger.With("component", "events")}}
	for _, p := range a.parts {
		if p.publish != nil {
			pubs = append(pubs, p.publish)
		}
	}
	cfg := tracker.Config{
		Store:         a.store,
		Durable:       a.durable,
		Publisher:     pubs,
		Rules:         a.rules,
		OnRecover:     a.storeRecovered,
		ReloadMargin:  a.reloadMargin(),
		Clock:         a.cfg.Clock,
		Logger:        a.cfg.Logger.With("component", "tracker"),
		SweepInterval: a.cfg.SweepInterval,
		FlushInterval: a.cfg.FlushInterval,
	}
	if a.beacon != nil { // and the peers: NATS and Redis
		cfg.NodeAlive, cfg.Peers = a.beacon.Alive, a.peers
	}
	var err error
	if a.tracker, err = tracker.New(cfg); err != nil {
		return err
	}
	a.stats.Tracker = a.tracker.Stats
	// What the edges and the ingest consumers change, with webhooks,
	// waits for the webhooks' log before it is acknowledged.
	a.edge = a.tracker
	if a.webhooks != nil {
		a.edge = confirming{a.tracker, a.webhooks}
	}
	a.add(part{run: a.runTracker, stop: stopTracker})
	return nil
}

// reloadMargin is the margin above a durable version a user loaded into
// the hot state counts on from (tracker.Config.ReloadMargin): Redis may
// lose what the last checkpoint missed.
func (a *App) reloadMargin() uint64 {
	if a.cfg.RedisURL != "" {
		return 1 << 16
	}
	return 0
}

// runTracker runs the tracker; its error is the last checkpoint's.
func (a *App) runTracker(ctx context.Context) error {
	err := a.tracker.Run(ctx)
	if err != nil {
		a.log.Error("final checkpoint failed", "err", err)
	}
	return err
}

// publishers hands every change to each of its publishers in turn, and
// every join and leave of a room to each of them that takes room events
// (tracker.RoomPublisher: the bus, Kafka, webhooks on the outbox, the
// log), in the same order.
type publishers []tracker.Publisher

var _ tracker.RoomPublisher = publishers(nil)

func (ps publishers) Publish(ev *presence.Event) {
	for _, p := range ps {
		p.Publish(ev)
	}
}

func (ps publishers) PublishRoom(ev *presence.RoomEvent) {
	for _, p := range ps {
		if rp, ok := p.(tracker.RoomPublisher); ok {
			rp.PublishRoom(ev)
		}
	}
}

// logPublisher logs every change of visible presence, and every join and
// leave of a room, at debug level (-log-level debug).
type logPublisher struct{ log *slog.Logger }

func (p logPublisher) Publish(ev *presence.Event) {
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("presence change", "user_id", ev.UserID, "from", ev.Prev.String(), "to", ev.Status.String(),
			"text", ev.Text, "version", ev.Version)
	}
}

func (p logPublisher) PublishRoom(ev *presence.RoomEvent) {
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("room change", "room", ev.Room, "user_id", ev.UserID, "event", ev.Kind.String(),
			"reason", ev.Reason.String(), "count", ev.Count, "version", ev.Version)
	}
}
