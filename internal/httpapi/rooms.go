package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

// RoomTracker is an optional ability of a Tracker: rooms
// (tracker.Tracker). Without it the room endpoints answer 501
// rooms_unavailable, as they do when the tracker's store has no rooms.
type RoomTracker interface {
	Join(ctx context.Context, user, device, room string) (presence.RoomEvent, error)
	Leave(ctx context.Context, user, device, room string) (presence.RoomEvent, error)
	RoomPage(ctx context.Context, room, after string, limit int, out []string) (tracker.RoomPage, error)
	RoomCounts(ctx context.Context, rooms []string, out []int) ([]int, error)
}

// RoomReader is an optional ability of a Reader: a page of a room's
// members as a viewer may see them (query.Reader.Room).
type RoomReader interface {
	Room(ctx context.Context, viewer, room, after string, limit int) (query.RoomView, error)
}

// Pages of a room's members.
const (
	DefaultRoomPage = 100            // members a read of a room answers without limit=
	MaxRoomPage     = query.MaxBatch // the largest limit= a read takes
)

// roomID is the id of a room in the request's path, validated.
func roomID(r *http.Request) (string, error) {
	room := r.PathValue("room")
	return room, checkID("room", room)
}

// allowRoom refuses a room that p's token does not allow (its rooms
// claim); the API key and -dev requests may use every room.
func allowRoom(p auth.Principal, room string) error {
	if !p.AllowsRoom(room) {
		return apierr.RoomNotAllowed(room)
	}
	return nil
}

func (s *Server) roomJoin(w http.ResponseWriter, r *http.Request) error {
	return s.roomWrite(w, r, true)
}

func (s *Server) roomLeave(w http.ResponseWriter, r *http.Request) error {
	return s.roomWrite(w, r, false)
}

// roomWrite serves POST /v1/rooms/{room}/join and /leave
// {"user_id","device_id"} (the body of a bye) as
// {"room":"r","count":3,"version":7}: the room after the operation. A
// client token acts for its own user and device, in the rooms its claim
// allows, with ratelimit.Rooms per device.
func (s *Server) roomWrite(w http.ResponseWriter, r *http.Request, join bool) error {
	room, err := roomID(r)
	if err != nil {
		return err
	}
	p, user, dev, err := s.deviceRequest(w, r, func(body []byte) (string, string, error) {
		req, err := decodeBye(body)
		return req.UserID, req.DeviceID, err
	})
	if err != nil {
		return err
	}
	if err := allowRoom(p, room); err != nil {
		return err
	}
	if p.Kind == auth.Client {
		if ok, wait := s.writes.Rooms.Take(ratelimit.RoomKey(user, dev), s.clock.Now().UnixMilli()); !ok {
			return tooMany(w, wait, "too many joins and leaves of rooms for this device: "+s.writes.Rooms.Limit().String())
		}
	}
	rt, ok := s.tracker.(RoomTracker)
	if !ok {
		return tracker.ErrRoomsUnsupported
	}
	op := rt.Leave
	if join {
		op = rt.Join
	}
	ev, err := op(r.Context(), user, dev, room)
	if err != nil {
		return err
	}
	count, version := ev.Count, ev.Version
	if ev.Room == "" {
		// Nothing changed (the user was a member already, or is still
		// one by another device, or is invisible): the room as it is.
		var one [1]string
		pg, err := rt.RoomPage(r.Context(), room, "", 1, one[:0])
		if err != nil {
			return err
		}
		count, version = pg.Count, pg.Version
	}
	b := append(make([]byte, 0, 64+len(room)), `{"room":`...)
	b = wire.AppendString(b, room)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(count), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, version, 10)
	writeJSON(w, http.StatusOK, append(b, "}\n"...))
	return nil
}

// roomGet serves GET /v1/rooms/{room}?limit=&after=&viewer_id= as
//
//	{"room":"r","count":3,"members":{"alice":"online","bob":null},"next":"bob","version":7}
//
// a page of up to limit members (default DefaultRoomPage, at most
// MaxRoomPage) after the member after, each with its status as the
// viewer may see it (null when hidden); next is the after= of the
// following page, null on the last. Viewers are as in the presence
// reads: a client token reads as its user, in the rooms its claim allows,
// and takes the poll throttle's token; the API key as viewer_id, without
// one as a stranger.
func (s *Server) roomGet(w http.ResponseWriter, r *http.Request) error {
	room, err := roomID(r)
	if err != nil {
		return err
	}
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	if err := allowRoom(p, room); err != nil {
		return err
	}
	limit := DefaultRoomPage
	raw, err := queryParam(r, "limit")
	if err != nil {
		return err
	}
	if raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > MaxRoomPage {
			return badRequest("invalid_query", "limit %q: want a number of members from 1 to %d", raw, MaxRoomPage)
		}
		limit = n
	}
	after, err := queryParam(r, "after")
	if err != nil {
		return err
	}
	if err := optionalID("after", after); err != nil {
		return err
	}
	var viewer string
	if after != "" && p.Kind == auth.Client {
		// A further page: a client reading a big room whole is not held
		// to one read per poll interval, only to its pages' own limit.
		claimed, err := queryParam(r, "viewer_id")
		if err != nil {
			return err
		}
		if err := optionalID("viewer_id", claimed); err != nil {
			return err
		}
		if viewer, err = p.ReadAs(claimed); err != nil {
			return err
		}
		if ok, wait := s.pages.Take(p.UserID, s.clock.Now().UnixMilli()); !ok {
			return tooMany(w, wait, fmt.Sprintf("too many further pages of rooms for this user: %s", ratelimit.RoomPages))
		}
	} else if viewer, err = s.readViewer(w, r, p); err != nil {
		return err
	}
	rr, ok := s.reader.(RoomReader)
	if !ok {
		return tracker.ErrRoomsUnsupported
	}
	v, err := rr.Room(r.Context(), viewer, room, after, limit)
	if err != nil {
		return err
	}
	b := wire.AppendRoomPage(make([]byte, 0, 64+len(v.Members)*24), room, v.Count, v.Members, v.Next, v.Version)
	writeJSON(w, http.StatusOK, append(b, '\n'))
	return nil
}

// roomCounts serves GET /v1/rooms?ids=a,b as {"a":3,"b":0}: the members
// of 1 to query.MaxBatch rooms, each answered once in the order asked. A
// client token may ask for the rooms its claim allows, and takes the poll
// throttle's token as a read of presence does.
func (s *Server) roomCounts(w http.ResponseWriter, r *http.Request) error {
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	raw, err := queryParam(r, "ids")
	if err != nil {
		return err
	}
	sc := getIDScratch()
	defer putIDScratch(sc)
	ids, err := parseIDList("ids", raw, sc)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := allowRoom(p, id); err != nil {
			return err
		}
	}
	if _, err := s.viewer(w, r, p, ""); err != nil {
		return err
	}
	rt, ok := s.tracker.(RoomTracker)
	if !ok {
		return tracker.ErrRoomsUnsupported
	}
	counts, err := rt.RoomCounts(r.Context(), ids, make([]int, 0, len(ids)))
	if err != nil {
		return err
	}
	b := wire.AppendRoomCounts(make([]byte, 0, 16+len(ids)*16), ids, counts)
	writeJSON(w, http.StatusOK, append(b, '\n'))
	return nil
}
