package memstore

import (
	"context"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/rooms"
	"github.com/presenced/presenced/internal/tracker"
)

// Rooms live in a rooms.Table beside the user tables: the rooms' side in
// the Table, each user's side (its devices' rooms) in its shard's
// rooms.Users, found by the index of its record. The user's side is
// changed only under the user's shard lock, so a device's end and the
// leaves of its rooms are one step: every operation that may end a device
// or turn the user invisible ends with afterRooms, under the same lock,
// and returns the joins and leaves in its Change. A record with a device
// in a room carries flagRooms, which keeps the common beat of a user in no
// room off this path, and keeps the record (whose index names the user
// in rooms.Users) from eviction.

var _ tracker.RoomStore = (*Store)(nil)

// afterRooms is the end of an operation on record idx of shard sh, whose
// user is u after it and was a member (presence.User.RoomMember) before:
// the devices of the user in rooms that the operation ended leave them
// (bye is the device that said bye, if any), and a change of membership
// (invisibility) is a leave or join of every room. The events are
// appended to ch.Rooms. Held: sh.mu.
func (s *Store) afterRooms(sh *shard, idx int, u *presence.User, member bool, bye string, now int64, ch *presence.Change) {
	r := &sh.t.recs[idx]
	if r.flags&flagRooms == 0 {
		return
	}
	ui, id := uint32(idx), sh.t.str(r.id())
	sh.keys = sh.rooms.Devices(ui, sh.keys[:0])
	for _, k := range sh.keys {
		if s.hasDevice(u, k) {
			continue
		}
		reason := presence.ReasonEnded
		if bye != "" && k == s.rooms.DeviceKey(bye) {
			reason = presence.ReasonBye
		}
		ch.Rooms = s.rooms.LeaveAll(&sh.rooms, ui, id, k, reason, now, ch.Rooms)
	}
	if m := u.RoomMember(); m != member && sh.rooms.InRooms(ui) {
		n := len(ch.Rooms)
		ch.Rooms = s.rooms.SetCounted(&sh.rooms, ui, id, m, now, ch.Rooms)
		for i := n; i < len(ch.Rooms); i++ {
			face(&ch.Rooms[i], u)
		}
	}
	if !sh.rooms.InRooms(ui) {
		r.flags &^= flagRooms
	}
}

// hasDevice reports whether u holds the device of key k (alive: the rules
// dropped the dead ones in the operation that inflated u).
func (s *Store) hasDevice(u *presence.User, k rooms.DeviceKey) bool {
	for i := range u.Devices {
		if s.rooms.DeviceKey(u.Devices[i].ID) == k {
			return true
		}
	}
	return false
}

// Join implements tracker.RoomStore.
func (s *Store) Join(_ context.Context, now int64, user, device, room string) (presence.RoomEvent, bool, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		return presence.RoomEvent{}, false, presence.ErrDeviceNotAlive
	}
	u, _ := sh.t.inflate(idx, user)
	alive := false
	for i := range u.Devices {
		if d := &u.Devices[i]; d.ID == device && now < s.rules.End(d) {
			alive = true
		}
	}
	if !alive {
		return presence.RoomEvent{}, false, presence.ErrDeviceNotAlive
	}
	ev, changed, err := s.rooms.Join(&sh.rooms, uint32(idx), user, device, room, u.RoomMember(), now)
	if err == nil {
		sh.t.recs[idx].flags |= flagRooms
	}
	face(&ev, &u)
	return ev, changed, err
}

// face puts the public status and settings of u on a join (a leave
// carries none).
func face(ev *presence.RoomEvent, u *presence.User) {
	if ev.Kind == presence.RoomJoin {
		ev.Status, ev.Settings = u.Pub, u.Settings
	}
}

// Leave implements tracker.RoomStore.
func (s *Store) Leave(_ context.Context, now int64, user, device, room string) (presence.RoomEvent, bool, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 || sh.t.recs[idx].flags&flagRooms == 0 {
		return presence.RoomEvent{}, false, nil
	}
	ev, changed := s.rooms.Leave(&sh.rooms, uint32(idx), user, device, room, presence.ReasonLeft, now)
	if !sh.rooms.InRooms(uint32(idx)) {
		sh.t.recs[idx].flags &^= flagRooms
	}
	return ev, changed, nil
}

// RoomPage implements tracker.RoomStore.
func (s *Store) RoomPage(_ context.Context, room, after string, limit int, out []string) (tracker.RoomPage, error) {
	members, n, version, more := s.rooms.Page(room, after, limit, out[:0])
	return tracker.RoomPage{Members: members, Count: n, Version: version, More: more}, nil
}

// RoomCounts implements tracker.RoomStore.
func (s *Store) RoomCounts(_ context.Context, ids []string, out []int) ([]int, error) {
	for _, id := range ids {
		n, _ := s.rooms.Count(id)
		out = append(out, n)
	}
	return out, nil
}
