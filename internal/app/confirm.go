package app

import (
	"context"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/webhook"
)

// The embedded node's durable store keeps the webhooks' outbox.
var _ webhook.Outbox = (*sqlitestore.Store)(nil)

// confirming is the tracker as the edges (httpapi, gateway) and the
// ingest consumers use it when webhooks are on: an operation that made a
// change returns only once the change is in the log the webhooks are
// delivered from (webhook.Sender.Confirm: the outbox's file, or the NATS
// stream), so a change a client was answered for — or whose ingest event
// was acknowledged — reaches the webhooks even if the node dies right
// after. An operation that changed nothing (the common heartbeat) waits
// for nothing.
type confirming struct {
	*tracker.Tracker
	hooks *webhook.Sender
}

func (c confirming) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	ch, err := c.Tracker.Heartbeat(ctx, user, device, active)
	c.confirm(ctx, &ch)
	return ch, err
}

func (c confirming) HeartbeatRead(ctx context.Context, user, device string, active bool, snap *presence.Snapshot) (presence.Change, bool, error) {
	ch, read, err := c.Tracker.HeartbeatRead(ctx, user, device, active, snap)
	c.confirm(ctx, &ch)
	return ch, read, err
}

func (c confirming) SocketBeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	ch, err := c.Tracker.SocketBeat(ctx, user, device, active)
	c.confirm(ctx, &ch)
	return ch, err
}

func (c confirming) SocketConnect(ctx context.Context, user, device string) (presence.Change, error) {
	ch, err := c.Tracker.SocketConnect(ctx, user, device)
	c.confirm(ctx, &ch)
	return ch, err
}

func (c confirming) SetStatus(ctx context.Context, user string, m presence.Manual, text string) (presence.Change, error) {
	ch, err := c.Tracker.SetStatus(ctx, user, m, text)
	c.confirm(ctx, &ch)
	return ch, err
}

func (c confirming) SourceBeat(ctx context.Context, src uint32, user, device string, active, connect bool) (presence.Change, error) {
	ch, err := c.Tracker.SourceBeat(ctx, src, user, device, active, connect)
	c.confirm(ctx, &ch)
	return ch, err
}

func (c confirming) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	ch, err := c.Tracker.Bye(ctx, user, device)
	c.confirm(ctx, &ch)
	return ch, err
}

func (c confirming) Join(ctx context.Context, user, device, room string) (presence.RoomEvent, error) {
	ev, err := c.Tracker.Join(ctx, user, device, room)
	c.confirmRoom(ctx, &ev)
	return ev, err
}

func (c confirming) Leave(ctx context.Context, user, device, room string) (presence.RoomEvent, error) {
	ev, err := c.Tracker.Leave(ctx, user, device, room)
	c.confirmRoom(ctx, &ev)
	return ev, err
}

// confirm waits for the webhooks' log if ch is a change they are sent
// (not a change of settings alone, nor one only the user sees:
// webhook.Sender.Publish), or holds joins or leaves of rooms (a bye of
// one of two devices leaves its rooms, the user online).
func (c confirming) confirm(ctx context.Context, ch *presence.Change) {
	if (ch.Changed && !ch.Event.SettingsOnly && !ch.Event.SelfOnly) || len(ch.Rooms) > 0 {
		c.hooks.Confirm(ctx)
	}
}

// confirmRoom waits for the webhooks' log if ev is a join or leave (a
// join of a room the device is in already is none).
func (c confirming) confirmRoom(ctx context.Context, ev *presence.RoomEvent) {
	if ev.Kind != 0 {
		c.hooks.Confirm(ctx)
	}
}
