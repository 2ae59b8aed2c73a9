package tracker

import (
	"context"
	"errors"
	"fmt"

	"github.com/presenced/presenced/internal/presence"
)

// RoomStore is an optional ability of a Store: rooms (presence/room.go).
// A device's memberships live with the device: the store ends them in
// the same step as the device (its bye, its ttl, the close grace) and
// returns those leaves in the Change of that step (presence.Change.Rooms),
// as it returns the joins and leaves of a user going invisible and back.
type RoomStore interface {
	// Join puts device of user in room; changed reports the user's join
	// (ev). presence.ErrDeviceNotAlive when the store holds no such
	// device alive, presence.ErrTooManyRooms at the device's cap.
	Join(ctx context.Context, now int64, user, device, room string) (ev presence.RoomEvent, changed bool, err error)
	// Leave takes device out of room; changed reports the user's leave.
	Leave(ctx context.Context, now int64, user, device, room string) (ev presence.RoomEvent, changed bool, err error)
	// RoomPage reads up to limit members of room after the member after
	// ("" for the first page), in the store's one order of pages.
	RoomPage(ctx context.Context, room, after string, limit int, out []string) (RoomPage, error)
	// RoomCounts appends the count of each room to out.
	RoomCounts(ctx context.Context, rooms []string, out []int) ([]int, error)
}

// RoomPage is one page of a room's members.
type RoomPage struct {
	Members []string
	Count   int    // members of the whole room
	Version uint64 // the room's version when read
	More    bool   // members follow after the last of Members
}

// RoomPublisher is an optional ability of a Publisher: it receives every
// join and leave. Events of one room may reach it out of order (two users
// of two store shards); each carries the room's version, so a consumer
// puts them back in order.
type RoomPublisher interface {
	PublishRoom(ev *presence.RoomEvent)
}

// ErrRoomsUnsupported is returned by the room methods when the state
// store has no rooms (both of presenced's stores have them).
var ErrRoomsUnsupported = errors.New("rooms are not available with this node's state store")

// Join puts device of user in room and publishes the user's join if it
// became a member. The device joins after its first beat or connect
// (presence.ErrDeviceNotAlive before).
func (t *Tracker) Join(ctx context.Context, user, device, room string) (presence.RoomEvent, error) {
	return t.room(ctx, user, device, room, true)
}

// Leave takes device of user out of room and publishes the user's leave
// if it was the last of its devices there. Leaving a room the device is
// not in changes nothing.
func (t *Tracker) Leave(ctx context.Context, user, device, room string) (presence.RoomEvent, error) {
	return t.room(ctx, user, device, room, false)
}

func (t *Tracker) room(ctx context.Context, user, device, room string, join bool) (presence.RoomEvent, error) {
	rs := t.link.can.rooms
	if rs == nil {
		return presence.RoomEvent{}, ErrRoomsUnsupported
	}
	op := rs.Leave
	if join {
		op = rs.Join
	}
	// A join or leave is a user's action the client retries: while the
	// store is down it is refused, not buffered.
	var ev presence.RoomEvent
	var changed bool
	call := func(ctx context.Context) (err error) {
		ev, changed, err = op(ctx, t.Now(), user, device, room)
		return err
	}
	err := t.roomsCall(ctx, user, call)
	if join && errors.Is(err, presence.ErrDeviceNotAlive) && t.owned != nil && t.owned.claimNow(ctx, user, device) {
		// Its socket is open here and the store has not heard of it
		// yet: claimed now, the join is tried once more; if the claim
		// could not be made, the join is refused as the store's outage
		// is, for the client to send again.
		if err = t.roomsCall(ctx, user, call); errors.Is(err, presence.ErrDeviceNotAlive) {
			err = errNotClaimed
		}
	}
	if err != nil {
		if join {
			return ev, fmt.Errorf("join %q: %w", room, err)
		}
		return ev, fmt.Errorf("leave %q: %w", room, err)
	}
	if changed {
		t.events.publishRoom(&ev)
	}
	return ev, nil
}

// RoomPage reads a page of room's members (see RoomStore.RoomPage).
func (t *Tracker) RoomPage(ctx context.Context, room, after string, limit int, out []string) (RoomPage, error) {
	rs := t.link.can.rooms
	if rs == nil {
		return RoomPage{}, ErrRoomsUnsupported
	}
	var p RoomPage
	err := t.roomsCall(ctx, "", func(ctx context.Context) (err error) {
		p, err = rs.RoomPage(ctx, room, after, limit, out)
		return err
	})
	return p, err
}

// RoomCounts appends the member count of each room to out.
func (t *Tracker) RoomCounts(ctx context.Context, rooms []string, out []int) ([]int, error) {
	rs := t.link.can.rooms
	if rs == nil {
		return out, ErrRoomsUnsupported
	}
	err := t.roomsCall(ctx, "", func(ctx context.Context) (err error) {
		out, err = rs.RoomCounts(ctx, rooms, out)
		return err
	})
	return out, err
}

// errRoomsDown refuses the calls of rooms while the store is down.
var errRoomsDown = &outageError{errors.New("the state store is down")}

// errNotClaimed refuses a join of a device whose socket this node holds
// but whose claim has not reached the store (the node has no lease yet,
// or the claim failed and waits for its retry).
var errNotClaimed = fmt.Errorf("this node has not yet told the state store about the device: %w", ErrUnavailable)

// roomsCall runs f, a call of the store's rooms, under the store's call
// timeout and outage rules, and refuses it while the store (or user's
// part) is down. A join or leave is a call about user: its failure puts
// the user's part down, unless the store says only part of it failed
// (the user's side was written and a room's master did not answer: a
// sweep applies its ops). A read of rooms is a call about keys of no
// user: on a store of parts it puts nothing down (Partitioned), as a
// call about the leases does.
func (t *Tracker) roomsCall(ctx context.Context, user string, f func(context.Context) error) error {
	if user != "" && t.link.stateFor(user) == stateDown || user == "" && t.link.down() {
		return errRoomsDown
	}
	b := t.link.bound(ctx)
	err := f(b.ctx)
	t.link.release(b)
	if user == "" || partial(err) {
		return t.link.checkKey(ctx, err)
	}
	return t.link.checkUser(ctx, user, err)
}
