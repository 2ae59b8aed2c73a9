package query

import (
	"context"
	"errors"
	"fmt"

	"github.com/presenced/presenced/internal/privacy"
)

// Rooms reads the members of rooms, a page at a time
// (tracker.Tracker.RoomPage, which the app adapts).
type Rooms interface {
	// RoomPage reads up to limit members of room after the member after
	// ("" for the first page) into out, in the store's one order.
	RoomPage(ctx context.Context, room, after string, limit int, out []string) (RoomPage, error)
}

// RoomPage is one page of a room's members as the Rooms source reads it.
type RoomPage struct {
	Members []string
	Count   int    // members of the whole room
	Version uint64 // the room's version when read
	More    bool   // members follow after the last of Members
}

// RoomView is what one viewer may see of a page of a room: every member
// listed (an invisible user is no member, so never listed nor counted),
// each with its status as the privacy filter shows it to the viewer
// (StatusVisible false when it is hidden).
type RoomView struct {
	Room    string
	Count   int    // members of the whole room
	Version uint64 // the room's version when read
	Members []privacy.View
	// Next is the cursor of the following page (the last member of this
	// one) when more follow, else empty.
	Next string
}

// ErrNoRooms is returned by Room when the Reader has no Config.Rooms.
var ErrNoRooms = errors.New("query: no rooms to read (Config.Rooms is nil)")

// Room reads a page of up to limit (1 to MaxBatch) members of room after
// the member after ("" for the first page), as viewer may see them; an
// empty viewer is anonymous, as in Read. The members' statuses are read
// with ReadStatuses: one batch, so every privacy rule of a read holds,
// the equal time of hidden and absent users too.
func (r *Reader) Room(ctx context.Context, viewer, room, after string, limit int) (RoomView, error) {
	if r.rooms == nil {
		return RoomView{}, ErrNoRooms
	}
	if limit < 1 || limit > MaxBatch {
		return RoomView{}, fmt.Errorf("query: room page of %d members: 1 to %d", limit, MaxBatch)
	}
	pg, err := r.rooms.RoomPage(ctx, room, after, limit, make([]string, 0, min(limit, 64)))
	if err != nil {
		return RoomView{}, err
	}
	v := RoomView{Room: room, Count: pg.Count, Version: pg.Version}
	if len(pg.Members) == 0 {
		return v, nil
	}
	v.Members = make([]privacy.View, len(pg.Members))
	if err := r.ReadStatuses(ctx, viewer, pg.Members, v.Members); err != nil {
		return RoomView{}, err
	}
	if pg.More {
		v.Next = pg.Members[len(pg.Members)-1]
	}
	return v, nil
}
