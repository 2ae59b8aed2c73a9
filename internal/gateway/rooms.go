package gateway

import (
	"context"
	"errors"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/ratelimit"
)

// Rooms over the socket: join and leave put the socket's own device in a
// room and take it out (the tracker's rooms), watch_room and unwatch_room
// make the connection a watcher of a room (the room hub). Every one of
// them needs the room to be allowed by the token's rooms claim.

// RoomSink is a connection watching rooms as the room hub sees it; *conn
// implements it.
type RoomSink = fanout.RoomSink

// RoomHub is the fan-out of rooms as the gateway uses it
// (*fanout.RoomHub).
type RoomHub interface {
	// Watch makes s watch room: it sends s the room's snapshot, then its
	// changes; fanout.ErrTooManyWatchedRooms at the hub's cap of rooms
	// per connection.
	Watch(ctx context.Context, s RoomSink, room string) error
	Unwatch(s RoomSink, room string)
	// MaxWatched is the cap of rooms one connection watches.
	MaxWatched() int
	// Remove stops s watching every room (its connection closed).
	Remove(s RoomSink)
}

// RoomTracker is an optional ability of a Tracker, found by type
// assertion: the rooms of a device (tracker.Tracker.Join and Leave).
// Without it join and leave answer rooms_unavailable.
type RoomTracker interface {
	// Join puts device of user in room (presence.ErrTooManyRooms at the
	// device's cap, tracker.ErrRoomsUnsupported on a store without rooms).
	Join(ctx context.Context, user, device, room string) (presence.RoomEvent, error)
	// Leave takes device of user out of room; leaving a room the device
	// is not in changes nothing.
	Leave(ctx context.Context, user, device, room string) (presence.RoomEvent, error)
}

var _ RoomSink = (*conn)(nil)

// everyRoom lets its holder into every room: the anonymous caller of
// development mode, who may act for any user, may enter any room too.
var everyRoom = func() *auth.Rooms {
	r, err := auth.ParseRooms([]string{"*"})
	if err != nil {
		panic(err)
	}
	return r
}()

// roomsOf returns the rooms a connection of p may join and watch: its
// token's claim (nil, none, without one), every room for the anonymous
// caller of development mode.
func roomsOf(p auth.Principal) *auth.Rooms {
	if p.Kind == auth.Anonymous {
		return everyRoom
	}
	return p.Rooms
}

// DeliverRoom queues a frame about room (fanout.RoomSink). Frames of rooms
// are never coalesced: each join and leave is its own message. Like
// Deliver it never blocks; a connection whose queue is full is closed
// 4002.
func (c *conn) DeliverRoom(_ string, frame []byte) {
	c.enqueue(outFrame{op: ws.OpText, data: frame})
}

// roomAllowed reports whether the connection's token lets it into room,
// and answers the message of type request room_not_allowed when it does
// not.
func (c *conn) roomAllowed(request, room string) bool {
	if c.rooms.Allows(room) {
		return true
	}
	e := apierr.RoomNotAllowed(room)
	c.sendRoomError(request, room, e.Code, "%s", e.Message)
	return false
}

// joinLeave puts the connection's device in room (join) or takes it out.
// Nothing answers success: watchers of the room, the device's own
// connections among them, see the join or leave.
func (c *conn) joinLeave(ctx context.Context, room string, join bool) {
	req := "leave"
	if join {
		req = "join"
	}
	if !c.roomAllowed(req, room) {
		return
	}
	rt := c.g.roomTracker
	if rt == nil {
		c.sendRoomError(req, room, "rooms_unavailable", "rooms are not available on this node")
		return
	}
	// Joins and leaves churn the rooms' watchers: a device gets a burst
	// (enough to rejoin all its rooms after a reconnect, twice), counted
	// across all its sockets to this node, then a few a second.
	if ok, wait := c.g.roomOps.Take(ratelimit.RoomKey(c.user, c.device), c.g.now()); !ok {
		c.g.stats.rateLimited.Add(1)
		c.sendRoomError(req, room, "rate_limited", "too many joins and leaves of rooms for this device: %s; nothing changed; retry in %ds",
			ratelimit.Rooms, ratelimit.RetryAfter(wait))
		return
	}
	op := rt.Leave
	if join {
		op = rt.Join
	}
	if _, err := op(ctx, c.user, c.device, room); err != nil {
		c.roomOpError(req, room, err)
		return
	}
	c.mu.Lock()
	if join {
		if c.joined == nil {
			c.joined = make(map[string]struct{})
		}
		c.joined[room] = struct{}{}
	} else {
		delete(c.joined, room)
	}
	c.mu.Unlock()
}

// RejoinRooms joins again the rooms every open connection joined over it
// and did not leave: after the state store lost them (it came back
// empty, or this node's lease was taken over while it was cut off), once
// the node's devices are claimed again. A room joined already changes
// nothing. It returns how many joins it made and the first error (the
// others are tried all the same).
func (g *Gateway) RejoinRooms(ctx context.Context) (int, error) {
	rt := g.roomTracker
	if rt == nil {
		return 0, nil
	}
	type rejoin struct {
		user, device string
		rooms        []string
	}
	var todo []rejoin
	g.mu.Lock()
	for _, c := range g.conns {
		c.mu.Lock()
		if len(c.joined) > 0 && !c.closed {
			r := rejoin{user: c.user, device: c.device}
			for room := range c.joined {
				r.rooms = append(r.rooms, room)
			}
			todo = append(todo, r)
		}
		c.mu.Unlock()
	}
	g.mu.Unlock()
	n := 0
	var first error
	for _, r := range todo {
		for _, room := range r.rooms {
			if ctx.Err() != nil {
				return n, ctx.Err()
			}
			if _, err := rt.Join(ctx, r.user, r.device, room); err != nil {
				if first == nil {
					first = err
				}
				continue
			}
			n++
		}
	}
	return n, first
}

// watchRoom makes the connection a watcher of room: the hub sends it the
// room's snapshot, then its changes.
func (c *conn) watchRoom(ctx context.Context, room string) {
	if !c.roomAllowed("watch_room", room) {
		return
	}
	h := c.g.roomHub
	if h == nil {
		c.sendRoomError("watch_room", room, "rooms_unavailable", "watching rooms is not available on this node")
		return
	}
	err := h.Watch(ctx, c, room)
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// Torn down meanwhile: teardown's Remove may have run before this
		// Watch registered the connection.
		h.Remove(c)
		return
	}
	switch {
	case err == nil:
	case errors.Is(err, fanout.ErrTooManyWatchedRooms):
		c.sendRoomError("watch_room", room, "too_many_watched_rooms", "this connection watches as many rooms as one connection may (-max-watched-rooms %d); unwatch one first (%q is not watched)",
			c.g.roomHub.MaxWatched(), room)
	default:
		c.roomOpError("watch_room", room, err)
	}
}

// unwatchRoom stops the connection watching room; nothing answers.
func (c *conn) unwatchRoom(room string) {
	if !c.roomAllowed("unwatch_room", room) {
		return
	}
	if h := c.g.roomHub; h != nil {
		h.Unwatch(c, room)
		return
	}
	c.sendRoomError("unwatch_room", room, "rooms_unavailable", "watching rooms is not available on this node")
}
