package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gobwas/ws"
	"go.opentelemetry.io/otel/trace"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/tracing"
	"github.com/presenced/presenced/internal/wire"
)

// Sink is a watching connection as the hub sees it; *conn implements it.
type Sink = fanout.Sink

// Hub is the fan-out as the gateway uses it (*fanout.Hub).
type Hub interface {
	Subscribe(ctx context.Context, s Sink, ids []string) ([]string, error)
	Unsubscribe(s Sink, ids []string) (removed int)
	Remove(s Sink)
	// SnapshotSent records what a subscribe's snapshot shows, just before
	// it is queued (fanout.Hub.SnapshotSent).
	SnapshotSent(s Sink, views []privacy.View)
}

var _ Sink = (*conn)(nil)

// opSpanNames are the span names of the operations (internal/tracing), by
// message kind; heartbeats, far too many, have none.
var opSpanNames = [...]string{
	msgSetStatus:   "ws set_status",
	msgSubscribe:   "ws subscribe",
	msgUnsubscribe: "ws unsubscribe",
	msgBye:         "ws bye",
	msgJoin:        "ws join",
	msgLeave:       "ws leave",
	msgWatchRoom:   "ws watch_room",
	msgUnwatchRoom: "ws unwatch_room",
}

// handle applies one decoded message. It returns false once the connection
// is closing.
func (c *conn) handle(m *clientMsg) bool {
	if m.kind == msgHeartbeat {
		// No timer of its own: the tracker bounds the calls to a remote
		// state store, and the one durable write a heartbeat may wait on
		// — with webhooks, a change's place in their log (app's
		// confirming) — is bounded by webhook.Config.ConfirmTimeout and
		// not waited on while that log is known failing.
		if _, err := c.g.tracker.SocketBeat(c.g.ctx, c.user, c.device, m.active); err != nil {
			c.opError("heartbeat", err)
			return true
		}
		c.lastBeat.Store(c.g.now())
		return true
	}
	ctx, cancel := c.opContext()
	defer cancel()
	if tracing.On() {
		var span trace.Span
		ctx, span = tracing.Start(ctx, opSpanNames[m.kind], trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
	}
	switch m.kind {
	case msgSetStatus:
		// A status change is a durable write before it applies: people
		// change status at human speed, so a user gets a few, counted
		// across all their sockets and HTTP requests.
		if ok, wait := c.g.writes.Status.Take(c.user, c.g.now()); !ok {
			c.g.stats.rateLimited.Add(1)
			c.sendError("rate_limited", "too many status changes for this user: %s; retry in %ds", ratelimit.Status, ratelimit.RetryAfter(wait))
			return true
		}
		if _, err := c.g.tracker.SetStatus(ctx, c.user, m.manual, m.text); err != nil {
			c.opError("set_status", err)
		}
	case msgSubscribe:
		c.subscribe(ctx, m.userIDs, m.known)
	case msgUnsubscribe:
		if c.g.hub != nil {
			c.g.addSubs(c, -c.g.hub.Unsubscribe(c, m.userIDs))
		}
	case msgBye:
		if _, err := c.g.tracker.Bye(ctx, c.user, c.device); err != nil {
			c.opError("bye", err)
			return true
		}
		c.lastBeat.Store(-1) // ended by the bye: nothing to shorten
		c.close(closeNormal, "bye")
		return false
	case msgJoin, msgLeave:
		c.joinLeave(ctx, m.room, m.kind == msgJoin)
	case msgWatchRoom:
		c.watchRoom(ctx, m.room)
	case msgUnwatchRoom:
		c.unwatchRoom(m.room)
	}
	return true
}

// subscribe watches ids and answers the snapshot of those newly watched;
// with known (the versions the client holds of some of them, after a
// reconnect), each whose view is that version is left out and counted as
// unchanged. Only a view with a visible status has a version, and the
// client was sent that very view: leaving it out tells the client nothing
// a read would not.
func (c *conn) subscribe(ctx context.Context, ids []string, known map[string]uint64) {
	if len(ids) > c.g.cfg.MaxSubscriptions {
		c.sendError("too_many_subscriptions", "a connection may watch at most %d users", c.g.cfg.MaxSubscriptions)
		return
	}
	if c.g.hub == nil {
		c.sendError("unavailable", "subscriptions are not available on this node")
		return
	}
	// Every newly watched id is read for the snapshot: the user's sockets
	// share a budget of such reads, or a client that subscribes and
	// unsubscribes in a loop reads without end. Taken for as many ids as
	// the request may add — its ids, but no more than the connection has
	// room for (the hub's cap), so a re-subscribe of a full list costs
	// nothing — and given back for those that were not new or not read.
	take, read := max(0, min(len(ids), c.g.cfg.MaxSubscriptions-c.g.subsOf(c))), 0
	if ok, wait := c.g.snapshots.TakeN(c.user, take, c.g.now()); !ok {
		c.g.stats.rateLimited.Add(1)
		c.sendError("rate_limited", "too many ids subscribed for this user: %s ids, across all their connections to this node; none of these were added (those this connection watched stay watched); retry in %ds",
			c.g.snapshots.Limit(), ratelimit.RetryAfter(wait))
		return
	}
	defer func() { c.g.snapshots.Give(c.user, take-read, c.g.now()) }()
	if !c.g.reserveSubs(c, len(ids)) {
		c.sendError("too_many_subscriptions", "a user may watch at most %d users across all their connections to this node; none of these were added", c.g.cfg.MaxUserSubscriptions)
		return
	}
	// Its turn among the subscribes being resolved (Config.MaxSubscribing).
	select {
	case c.g.subscribing <- struct{}{}:
	case <-ctx.Done():
		c.g.addSubs(c, -len(ids))
		c.sendError("unavailable", "this node is resolving too many subscriptions to take these now; none of these were added; retry later")
		return
	}
	defer func() { <-c.g.subscribing }()
	// The connection's first subscribe — a client's, right after it
	// connected or reconnected — is part of its setup: it takes its turn
	// among the handshakes and subscribes being set up (Config.Setup). A
	// session set up adds users without waiting behind a storm of others.
	if !c.setUp {
		if err := c.g.setup.Enter(ctx); err != nil {
			c.g.addSubs(c, -len(ids))
			c.sendError("unavailable", "this node is setting up too many other connections to take these now; none of these were added; retry later")
			return
		}
		defer c.g.setup.Leave()
		c.setUp = true
	}
	added, err := c.g.hub.Subscribe(ctx, c, ids)
	c.g.addSubs(c, len(added)-len(ids)) // what the request did not add
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// Torn down meanwhile: teardown's Remove may have run before this
		// Subscribe registered the connection again.
		c.g.hub.Remove(c)
		return
	}
	if errors.Is(err, fanout.ErrRemoved) {
		return
	}
	if err != nil {
		if errors.Is(err, fanout.ErrTooManySubscriptions) {
			c.sendError("too_many_subscriptions", "a connection may watch at most %d users; none of these were added", c.g.cfg.MaxSubscriptions)
			return
		}
		c.opError("subscribe", err)
		return
	}
	views := make([]privacy.View, 0, len(added))
	for start := 0; start < len(added); start += query.MaxBatch {
		part := added[start:min(len(added), start+query.MaxBatch)]
		out := make([]privacy.View, len(part))
		read += len(part)
		if err := c.g.reader.Read(ctx, c.user, part, out); err != nil {
			// The subscription stands; the client may resubscribe to read.
			c.opError("subscribe", err)
			return
		}
		views = append(views, out...)
	}
	c.g.hub.SnapshotSent(c, views)
	if known == nil {
		c.enqueue(outFrame{op: ws.OpText, data: wire.AppendSnapshot(nil, views)})
		return
	}
	frame, unchanged := wire.AppendSnapshotKnown(nil, views, func(v *privacy.View) bool {
		k, ok := known[v.UserID]
		return ok && v.StatusVisible && v.Version != 0 && k == v.Version
	})
	c.g.stats.unchanged.Add(uint64(unchanged))
	c.enqueue(outFrame{op: ws.OpText, data: frame})
}

// opError answers a failed operation as apierr decides for every entry
// point; a failure of the server is logged.
func (c *conn) opError(op string, err error) { c.roomOpError(op, "", err) }

// roomOpError is opError for a message about room (none: ""); op is then
// the message's type, which the error names as its request.
func (c *conn) roomOpError(op, room string, err error) {
	if errors.Is(err, context.Canceled) && c.g.ctx.Err() != nil {
		return // shutting down
	}
	e := apierr.Classify(err)
	switch {
	case e == apierr.Internal:
		c.g.log.Error("websocket operation failed", "op", op, "user_id", c.user, "err", err)
	case e.Status == http.StatusNotImplemented:
		// The node's configuration (rooms_unavailable), not a failure.
	case e.Status >= 500:
		c.g.log.Warn("websocket operation failed: a backend is unavailable", "op", op, "user_id", c.user, "err", err)
	}
	c.sendRoomError(op, room, e.Code, "%s", e.Message)
}

func (c *conn) sendError(code, format string, args ...any) {
	c.sendRoomError("", "", code, format, args...)
}

// sendRoomError sends an error that answers a room message of type
// request about room, a valid room id, and names both ("": an error of no
// room, which names neither).
func (c *conn) sendRoomError(request, room, code, format string, args ...any) {
	c.enqueue(outFrame{op: ws.OpText, data: wire.AppendRoomError(nil, code, request, room, fmt.Sprintf(format, args...))})
}
