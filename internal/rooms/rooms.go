// Package rooms keeps who is in which room on the embedded node: the
// devices in each room, the members (counted users with a device in it),
// the join and leave events that are exactly the changes of membership,
// each room's count and version, and its members in pages (pure, no I/O).
//
// Two sets of shards, each with its own mutex, hold it. A user shard,
// chosen by the caller's UserRef, holds each user's record and its
// (device, room) pairs; a room shard, chosen by the hash of the room id,
// holds each room's record, count, version and members, sorted by the
// order key (a fixed hash of the user id, then the id) in chunks of at
// most 64 listed by a directory, so a page costs a binary search and its
// own length. Bulk storage holds no pointers: records and pairs are
// slices of plain values, ids sit in append-only byte arenas, indexes are
// open-addressing tables of integers and member chunks blocks of a slab
// of integers, so the collector scans nothing proportional to
// memberships.
//
// Lock order: the caller's lock of the user, then the table's user shard
// of that user, then one room shard at a time; never back. Count, Page
// and Stats take room shards (and user shards, for Stats) alone. A room
// emptied of devices is removed; its shard's version floor rises to its
// version, so the room made again never repeats a version, and versions
// start above Epoch<<32. A Table is safe for concurrent use as long as
// calls with the same UserRef are serialised by the caller.
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
	// Shards is the number of room shards, and of user shards, each with
	// its own mutex, rounded up to a power of two. Default 64, at most
	// 1024.
	Shards int
}

// UserRef is the caller's stable handle of a user (memstore: its shard
// and record). The caller serialises calls with the same UserRef (it
// holds that user's lock); calls with different refs may run at once.
// A UserRef names one user id for as long as the user has a device in a
// room.
type UserRef uint32

// Stats is what a Table holds.
type Stats struct {
	Rooms       int   // rooms with a member
	Members     int   // users who are a member of some room
	Memberships int   // (user, room) memberships: the sum of the rooms' counts
	DeviceRooms int   // (device, room) pairs, of counted users or not
	Bytes       int64 // bytes its slices and arenas hold
}

// Table is the room membership table. It is safe for concurrent use under
// the contract of UserRef.
type Table struct {
	maxRooms int
	base     uint64
	seed     maphash.Seed
	bits     uint
	mask     uint64
	rooms    []roomShard
	users    []userShard
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
		bits:     bits,
		mask:     1<<bits - 1,
		rooms:    make([]roomShard, 1<<bits),
		users:    make([]userShard, 1<<bits),
	}
	for i := range t.rooms {
		t.rooms[i].init(t.seed, bits)
		t.users[i].init(bits)
	}
	return t
}

func (t *Table) userShard(u UserRef) *userShard { return &t.users[refHash(u)&t.mask] }

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

// Join puts device of user (u, its id user) in room. counted says whether
// the user counts (is not invisible); it is taken when u has no device in
// any room, else the table holds it (SetCounted). changed reports a join
// event (ev): the user became a member. Joining a room the device is in
// already is a no-op. A device in MaxRooms rooms is refused with
// presence.ErrTooManyRooms, and nothing changes. Ids must be valid
// (presence.ValidateID).
func (t *Table) Join(u UserRef, user, device, room string, counted bool, now int64) (ev presence.RoomEvent, changed bool, err error) {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	rs, rsi, ri, rh := t.lockRoom(room)
	defer rs.mu.Unlock()
	idx := us.find(u)
	dev, devRooms, other := noOff, 0, false
	if idx >= 0 {
		ref := noOff
		if ri >= 0 {
			ref = t.roomRef(rsi, ri)
		}
		for p := us.recs[idx].head; p != 0; p = us.pairs[p-1].next {
			pr := &us.pairs[p-1]
			mine := pr.dev == dev || dev == noOff && us.str(pr.dev) == device
			if mine {
				dev = pr.dev
				devRooms++
			}
			if pr.room == ref {
				if mine {
					return ev, false, nil
				}
				other = true
			}
		}
	}
	if devRooms >= t.maxRooms {
		return ev, false, presence.ErrTooManyRooms
	}
	if idx < 0 {
		idx = us.add(u, user, counted)
	}
	if dev == noOff {
		dev = us.intern(device)
	}
	if ri < 0 {
		ri = rs.add(rh, room, t.base)
	}
	us.addPair(idx, t.roomRef(rsi, ri), dev)
	rs.rooms[ri].devs++
	if !us.recs[idx].counted || other {
		return ev, false, nil
	}
	n, v := rs.join(ri, user)
	return presence.RoomEvent{
		Room: room, UserID: user, Kind: presence.RoomJoin, Reason: presence.ReasonJoined,
		Count: n, Version: v, At: now,
	}, true, nil
}

// Leave takes device of u out of room. changed reports a leave event:
// the device was the user's last in the room and the user counted.
// Leaving a room the device is not in is a no-op.
func (t *Table) Leave(u UserRef, device, room string, reason presence.RoomReason, now int64) (ev presence.RoomEvent, changed bool) {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	idx := us.find(u)
	if idx < 0 {
		return ev, false
	}
	rs, rsi, ri, _ := t.lockRoom(room)
	defer rs.mu.Unlock()
	if ri < 0 {
		return ev, false
	}
	ref := t.roomRef(rsi, ri)
	dev := noOff
	var target, tprev uint32
	other, shared := false, false
	for prev, p := uint32(0), us.recs[idx].head; p != 0; prev, p = p, us.pairs[p-1].next {
		pr := &us.pairs[p-1]
		mine := pr.dev == dev || dev == noOff && us.str(pr.dev) == device
		if mine {
			dev = pr.dev
		}
		switch {
		case pr.room == ref && mine:
			target, tprev = p, prev
		case pr.room == ref:
			other = true
		case mine:
			shared = true
		}
	}
	if target == 0 {
		return ev, false
	}
	uid := us.str(us.recs[idx].idOff)
	member := us.recs[idx].counted && !other
	us.unlink(idx, tprev, target, shared)
	ev, changed = rs.drop(ri, uid, member, reason, now)
	if us.recs[idx].npairs == 0 {
		us.remove(idx)
	}
	return ev, changed
}

// LeaveAll takes device of u out of all its rooms (its bye or end),
// appending the leave events to out.
func (t *Table) LeaveAll(u UserRef, device string, reason presence.RoomReason, now int64, out []presence.RoomEvent) []presence.RoomEvent {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	idx := us.find(u)
	if idx < 0 {
		return out
	}
	r := &us.recs[idx]
	dev, mine := noOff, 0
	us.scratch = us.scratch[:0] // the rooms of the user's other devices
	for p := r.head; p != 0; p = us.pairs[p-1].next {
		pr := &us.pairs[p-1]
		if pr.dev == dev || dev == noOff && us.str(pr.dev) == device {
			dev = pr.dev
			mine++
		} else {
			us.scratch = append(us.scratch, pr.room)
		}
	}
	if mine == 0 {
		return out
	}
	slices.Sort(us.scratch)
	uid := us.str(r.idOff)
	counted := r.counted
	prev, p := uint32(0), r.head
	for p != 0 {
		pr := us.pairs[p-1]
		if pr.dev != dev {
			prev, p = p, pr.next
			continue
		}
		us.unlink(idx, prev, p, mine > 1)
		mine--
		_, other := slices.BinarySearch(us.scratch, pr.room)
		rs, ri := t.unref(pr.room)
		rs.mu.Lock()
		if ev, ok := rs.drop(ri, uid, counted && !other, reason, now); ok {
			out = append(out, ev)
		}
		rs.mu.Unlock()
		p = pr.next
	}
	if us.recs[idx].npairs == 0 {
		us.remove(idx)
	}
	return out
}

// SetCounted sets whether u counts (false: invisible), appending a leave
// (or join) event for each room u has a device in, when it changes.
func (t *Table) SetCounted(u UserRef, counted bool, now int64, out []presence.RoomEvent) []presence.RoomEvent {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	idx := us.find(u)
	if idx < 0 || us.recs[idx].counted == counted {
		return out
	}
	r := &us.recs[idx]
	r.counted = counted
	kind, reason := presence.RoomLeave, presence.ReasonInvisible
	if counted {
		us.counted++
		kind, reason = presence.RoomJoin, presence.ReasonVisible
	} else {
		us.counted--
	}
	us.scratch = us.scratch[:0]
	for p := r.head; p != 0; p = us.pairs[p-1].next {
		us.scratch = append(us.scratch, us.pairs[p-1].room)
	}
	slices.Sort(us.scratch)
	uid := us.str(r.idOff)
	for i, ref := range us.scratch {
		if i > 0 && us.scratch[i-1] == ref {
			continue
		}
		rs, ri := t.unref(ref)
		rs.mu.Lock()
		var n int
		var v uint64
		if counted {
			n, v = rs.join(ri, uid)
		} else {
			n, v = rs.leave(ri, uid)
		}
		out = append(out, presence.RoomEvent{
			Room: rs.str(rs.rooms[ri].idOff), UserID: uid, Kind: kind, Reason: reason,
			Count: n, Version: v, At: now,
		})
		rs.mu.Unlock()
	}
	return out
}

// InRooms reports whether u has a device in some room.
func (t *Table) InRooms(u UserRef) bool {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	return us.find(u) >= 0
}

// Devices appends to out the devices of u that are in some room.
func (t *Table) Devices(u UserRef, out []string) []string {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	idx := us.find(u)
	if idx < 0 {
		return out
	}
	us.old = us.old[:0]
	for p := us.recs[idx].head; p != 0; p = us.pairs[p-1].next {
		d := us.pairs[p-1].dev
		if !slices.Contains(us.old, d) {
			us.old = append(us.old, d)
			out = append(out, us.str(d))
		}
	}
	return out
}

// DeviceRooms appends to out the rooms device of u is in.
func (t *Table) DeviceRooms(u UserRef, device string, out []string) []string {
	us := t.userShard(u)
	us.mu.Lock()
	defer us.mu.Unlock()
	idx := us.find(u)
	if idx < 0 {
		return out
	}
	dev := noOff
	for p := us.recs[idx].head; p != 0; p = us.pairs[p-1].next {
		pr := &us.pairs[p-1]
		if pr.dev == dev || dev == noOff && us.str(pr.dev) == device {
			dev = pr.dev
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

// Stats returns what the table holds, shard by shard (not one snapshot).
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
	for i := range t.users {
		us := &t.users[i]
		us.mu.Lock()
		st.Members += us.counted
		st.DeviceRooms += len(us.pairs) - len(us.pfree)
		st.Bytes += us.bytes()
		us.mu.Unlock()
	}
	return st
}
