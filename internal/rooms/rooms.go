// Package rooms keeps who is in which room on the embedded node: the
// devices in each room, the members (counted users with a device in it),
// the join and leave events that are exactly the changes of membership,
// each room's count and version, and its members in pages (pure, no I/O).
//
// It has two sides. The user side (Users) is each user's (device, room)
// pairs; the caller keeps one Users per shard of its own users, beside
// their records, guarded by its own lock, and names a user by its index
// there. The room side (Table) is shards by the hash of the room id, each
// with its own mutex, holding each room's record, count, version and
// members, sorted by the order key (a fixed hash of the user id, then the
// id) in chunks of at most 64 listed by a directory, so a page costs a
// binary search and its own length. Bulk storage holds no pointers:
// records and pairs are slices of plain values, room and member ids sit
// in append-only byte arenas, indexes are open-addressing tables of
// integers and member chunks blocks of a slab of integers, so the
// collector scans nothing proportional to memberships.
//
// Lock order: the caller's lock of the user's shard, then one room shard
// at a time; never back. Count, Page and Stats take room shards alone. A
// room emptied of devices is removed; its shard's version floor rises to
// its version, so the room made again never repeats a version, and
// versions start above Epoch<<32. A Table is safe for concurrent use; a
// Users is not (see Users).
package rooms

import (
	"hash/maphash"
	"slices"

	"github.com/presenced/presenced/internal/presence"
)

// Config configures a Table. Zero values take the documented defaults.
type Config struct {
	// Rules are the limits of rooms (MaxRooms per device).
	Rules presence.RoomRules
	// Epoch: room versions start above Epoch<<32, as users' do.
	Epoch uint64
	// Shards is the number of room shards, each with its own mutex,
	// rounded up to a power of two. Default 64, at most 1024.
	Shards int
}

// Stats is what a Table's room side holds.
type Stats struct {
	Rooms       int   // rooms with a member
	Memberships int   // (user, room) memberships: the sum of the rooms' counts
	Bytes       int64 // bytes its slices and arenas hold
}

// Table is the room side of the membership table, and the operations
// that change both sides. It is safe for concurrent use.
type Table struct {
	maxRooms int
	base     uint64
	seed     maphash.Seed
	devSeed  maphash.Seed
	bits     uint
	mask     uint64
	rooms    []roomShard
}

// noOff is no arena offset.
const noOff = ^uint32(0)

// New returns an empty Table.
func New(cfg Config) *Table {
	cfg.Rules = cfg.Rules.WithDefaults()
	cfg.Rules.MaxRooms = min(cfg.Rules.MaxRooms, presence.MaxMaxRooms)
	if cfg.Shards <= 0 {
		cfg.Shards = 64
	}
	cfg.Shards = min(cfg.Shards, 1024)
	var bits uint
	for 1<<bits < cfg.Shards {
		bits++
	}
	t := &Table{
		maxRooms: cfg.Rules.MaxRooms,
		base:     cfg.Epoch << 32,
		seed:     maphash.MakeSeed(),
		devSeed:  maphash.MakeSeed(),
		bits:     bits,
		mask:     1<<bits - 1,
		rooms:    make([]roomShard, 1<<bits),
	}
	for i := range t.rooms {
		t.rooms[i].init(t.seed, bits)
	}
	return t
}

// DeviceKey returns the key that names device on the user side.
func (t *Table) DeviceKey(device string) DeviceKey {
	return DeviceKey(maphash.String(t.devSeed, device))
}

// roomRef names room ri of shard rsi for the pairs.
func (t *Table) roomRef(rsi, ri int) uint32 {
	if uint64(ri) >= 1<<(32-t.bits) {
		panic("rooms: too many rooms in one shard")
	}
	return uint32(ri)<<t.bits | uint32(rsi)
}

// lockRoom locks the shard of room (rsi, the caller unlocks rs.mu) and
// finds room there: ri, or -1; rh is its hash, to add it.
func (t *Table) lockRoom(room string) (rs *roomShard, rsi, ri int, rh uint64) {
	rh = maphash.String(t.seed, room)
	rsi = int(rh & t.mask)
	rs = &t.rooms[rsi]
	rs.mu.Lock()
	return rs, rsi, rs.find(rh, room), rh
}

func (t *Table) unref(ref uint32) (rs *roomShard, ri int) {
	return &t.rooms[uint64(ref)&t.mask], int(ref >> t.bits)
}

// Join puts device of user (u in us, its id user) in room. counted says
// whether the user counts (is not invisible); it is taken when u has no
// device in any room, else us holds it (SetCounted). changed reports a
// join event (ev): the user became a member. Joining a room the device is
// in already is a no-op. A device in MaxRooms rooms is refused with
// presence.ErrTooManyRooms, and nothing changes. Ids must be valid
// (presence.ValidateID).
func (t *Table) Join(us *Users, u uint32, user, device, room string, counted bool, now int64) (ev presence.RoomEvent, changed bool, err error) {
	dev := t.DeviceKey(device)
	rs, rsi, ri, rh := t.lockRoom(room)
	defer rs.mu.Unlock()
	devRooms, other := 0, false
	if head := us.head(u); head != 0 {
		ref := noOff
		if ri >= 0 {
			ref = t.roomRef(rsi, ri)
		}
		for p := head; p != 0; p = us.pairs[p-1].next {
			pr := &us.pairs[p-1]
			mine := pr.dev == dev
			if mine {
				devRooms++
			}
			if pr.room == ref {
				if mine {
					return ev, false, nil
				}
				other = true
			}
		}
		counted = us.isCounted(u)
	}
	if devRooms >= t.maxRooms {
		return ev, false, presence.ErrTooManyRooms
	}
	if ri < 0 {
		ri = rs.add(rh, room, t.base)
	}
	us.addPair(u, t.roomRef(rsi, ri), dev, counted)
	rs.rooms[ri].devs++
	if !counted || other {
		return ev, false, nil
	}
	n, v := rs.join(ri, user)
	return presence.RoomEvent{
		Room: room, UserID: user, Kind: presence.RoomJoin, Reason: presence.ReasonJoined,
		Count: n, Version: v, At: now,
	}, true, nil
}

// Leave takes device of user (u in us) out of room. changed reports a
// leave event: the device was the user's last in the room and the user
// counted. Leaving a room the device is not in is a no-op.
func (t *Table) Leave(us *Users, u uint32, user, device, room string, reason presence.RoomReason, now int64) (ev presence.RoomEvent, changed bool) {
	head := us.head(u)
	if head == 0 {
		return ev, false
	}
	dev := t.DeviceKey(device)
	rs, rsi, ri, _ := t.lockRoom(room)
	defer rs.mu.Unlock()
	if ri < 0 {
		return ev, false
	}
	ref := t.roomRef(rsi, ri)
	var target, tprev uint32
	other := false
	for prev, p := uint32(0), head; p != 0; prev, p = p, us.pairs[p-1].next {
		pr := &us.pairs[p-1]
		switch {
		case pr.room != ref:
		case pr.dev == dev:
			target, tprev = p, prev
		default:
			other = true
		}
	}
	if target == 0 {
		return ev, false
	}
	member := us.isCounted(u) && !other
	us.unlink(u, tprev, target)
	return rs.drop(ri, user, member, reason, now)
}

// LeaveAll takes device dev of user (u in us) out of all its rooms (its
// bye or end), appending the leave events to out.
func (t *Table) LeaveAll(us *Users, u uint32, user string, dev DeviceKey, reason presence.RoomReason, now int64, out []presence.RoomEvent) []presence.RoomEvent {
	head := us.head(u)
	if head == 0 {
		return out
	}
	mine := 0
	us.scratch = us.scratch[:0] // the rooms of the user's other devices
	for p := head; p != 0; p = us.pairs[p-1].next {
		if pr := &us.pairs[p-1]; pr.dev == dev {
			mine++
		} else {
			us.scratch = append(us.scratch, pr.room)
		}
	}
	if mine == 0 {
		return out
	}
	slices.Sort(us.scratch)
	counted := us.isCounted(u)
	prev, p := uint32(0), head
	for p != 0 {
		pr := us.pairs[p-1]
		if pr.dev != dev {
			prev, p = p, pr.next
			continue
		}
		us.unlink(u, prev, p)
		_, other := slices.BinarySearch(us.scratch, pr.room)
		rs, ri := t.unref(pr.room)
		rs.mu.Lock()
		if ev, ok := rs.drop(ri, user, counted && !other, reason, now); ok {
			out = append(out, ev)
		}
		rs.mu.Unlock()
		p = pr.next
	}
	return out
}

// SetCounted sets whether user (u in us) counts (false: invisible),
// appending a leave (or join) event for each room u has a device in, when
// it changes.
func (t *Table) SetCounted(us *Users, u uint32, user string, counted bool, now int64, out []presence.RoomEvent) []presence.RoomEvent {
	head := us.head(u)
	if head == 0 || us.isCounted(u) == counted {
		return out
	}
	us.setCounted(u, counted)
	kind, reason := presence.RoomLeave, presence.ReasonInvisible
	if counted {
		kind, reason = presence.RoomJoin, presence.ReasonVisible
	}
	us.scratch = us.scratch[:0]
	for p := head; p != 0; p = us.pairs[p-1].next {
		us.scratch = append(us.scratch, us.pairs[p-1].room)
	}
	slices.Sort(us.scratch)
	for i, ref := range us.scratch {
		if i > 0 && us.scratch[i-1] == ref {
			continue
		}
		rs, ri := t.unref(ref)
		rs.mu.Lock()
		var n int
		var v uint64
		if counted {
			n, v = rs.join(ri, user)
		} else {
			n, v = rs.leave(ri, user)
		}
		out = append(out, presence.RoomEvent{
			Room: rs.str(rs.rooms[ri].idOff), UserID: user, Kind: kind, Reason: reason,
			Count: n, Version: v, At: now,
		})
		rs.mu.Unlock()
	}
	return out
}

// DeviceRooms appends to out the rooms device of u (in us) is in.
func (t *Table) DeviceRooms(us *Users, u uint32, device string, out []string) []string {
	dev := t.DeviceKey(device)
	for p := us.head(u); p != 0; p = us.pairs[p-1].next {
		if pr := &us.pairs[p-1]; pr.dev == dev {
			rs, ri := t.unref(pr.room)
			rs.mu.Lock()
			out = append(out, rs.str(rs.rooms[ri].idOff))
			rs.mu.Unlock()
		}
	}
	return out
}

// Count returns room's members and version; 0, 0 for a room without
// members.
func (t *Table) Count(room string) (n int, version uint64) {
	rs, _, ri, _ := t.lockRoom(room)
	defer rs.mu.Unlock()
	if ri < 0 || rs.rooms[ri].members == 0 {
		return 0, 0
	}
	return int(rs.rooms[ri].members), rs.rooms[ri].version
}

// Page appends to out up to limit members of room whose order key comes
// after after's ("" = from the first), and reports whether more follow.
// The order is by (hash of the user id, user id), the same on every node:
// a member present throughout a paging is listed exactly once whatever
// joins and leaves happen between pages. A page costs a binary search and
// its length. count and version are the room's as the page was read.
func (t *Table) Page(room, after string, limit int, out []string) (members []string, count int, version uint64, more bool) {
	rs, _, ri, _ := t.lockRoom(room)
	defer rs.mu.Unlock()
	if ri < 0 || rs.rooms[ri].members == 0 {
		return out, 0, 0, false
	}
	r := &rs.rooms[ri]
	out, more = rs.page(r, after, limit, out)
	return out, int(r.members), r.version, more
}

// Stats returns what the room side holds, shard by shard (not one
// snapshot).
func (t *Table) Stats() Stats {
	var st Stats
	for i := range t.rooms {
		rs := &t.rooms[i]
		rs.mu.Lock()
		st.Rooms += rs.live
		st.Memberships += rs.members
		st.Bytes += rs.bytes()
		rs.mu.Unlock()
	}
	return st
}
