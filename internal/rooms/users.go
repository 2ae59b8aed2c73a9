package rooms

import "unsafe"

// Users is the user side of the table for one shard of the caller's
// users: each user's (device, room) pairs, found by the caller's index of
// the user (memstore: its record in the shard). It keeps no user id and
// no device id: the caller has both, passes the user id to every call
// that may need it for an event, and names a device by its DeviceKey, a
// seeded 64-bit hash that no client can choose to collide. A user costs
// its head (4 bytes, for every index up to the highest in a room) and a
// pair (16 bytes) for each of its devices' rooms.
//
// Users is not safe for concurrent use: the caller's lock of the shard
// guards it, and every call naming one of its users is made under it.
type Users struct {
	// heads: for each user index, 0 (no pair) or its first pair + 1, with
	// headCounted set while the user counts (is not invisible).
	heads   []uint32
	pairs   []pair
	pfree   []uint32
	counted int // users with a pair who count

	scratch []uint32 // rooms, for SetCounted and LeaveAll
}

// headCounted marks, in a head, a user who counts.
const headCounted = 1 << 31

// DeviceKey names a device of a user on the user side.
type DeviceKey uint64

// pair is one device of a user in one room.
type pair struct {
	next uint32 // the user's next pair + 1, 0: the last
	room uint32 // the room's ref: its index<<shard bits | its shard
	dev  DeviceKey
}

// UserStats is what a Users holds.
type UserStats struct {
	Members     int   // users with a device in a room who count
	DeviceRooms int   // (device, room) pairs, of counted users or not
	Bytes       int64 // bytes its slices hold
}

// head returns u's first pair + 1, 0 if it has none.
func (s *Users) head(u uint32) uint32 {
	if int(u) >= len(s.heads) {
		return 0
	}
	return s.heads[u] &^ headCounted
}

// isCounted reports whether u, which has a pair, counts.
func (s *Users) isCounted(u uint32) bool { return s.heads[u]&headCounted != 0 }

// setHead sets u's first pair, keeping whether it counts; a user left
// with no pair is forgotten.
func (s *Users) setHead(u, p uint32) {
	if p == 0 {
		if s.isCounted(u) {
			s.counted--
		}
		s.heads[u] = 0
		return
	}
	s.heads[u] = s.heads[u]&headCounted | p
}

// setCounted sets whether u, which has a pair, counts.
func (s *Users) setCounted(u uint32, counted bool) {
	if counted == s.isCounted(u) {
		return
	}
	if counted {
		s.heads[u] |= headCounted
		s.counted++
	} else {
		s.heads[u] &^= headCounted
		s.counted--
	}
}

// InRooms reports whether u has a device in some room.
func (s *Users) InRooms(u uint32) bool { return s.head(u) != 0 }

// Devices appends to out the keys of u's devices that are in some room,
// each once.
func (s *Users) Devices(u uint32, out []DeviceKey) []DeviceKey {
	n := len(out)
	for p := s.head(u); p != 0; p = s.pairs[p-1].next {
		if d := s.pairs[p-1].dev; !contains(out[n:], d) {
			out = append(out, d)
		}
	}
	return out
}

func contains(ks []DeviceKey, k DeviceKey) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// addPair puts a pair at the head of u's list; a user without one takes
// counted.
func (s *Users) addPair(u uint32, room uint32, dev DeviceKey, counted bool) {
	if int(u) >= len(s.heads) {
		s.heads = append(s.heads, make([]uint32, int(u)+1-len(s.heads))...)
	}
	var p uint32
	if k := len(s.pfree); k > 0 {
		p = s.pfree[k-1]
		s.pfree = s.pfree[:k-1]
	} else {
		if len(s.pairs) >= headCounted-1 {
			panic("rooms: too many pairs in one shard")
		}
		p = uint32(len(s.pairs))
		s.pairs = append(s.pairs, pair{})
	}
	h := s.head(u)
	s.pairs[p] = pair{next: h, room: room, dev: dev}
	if h == 0 && counted {
		s.heads[u] = headCounted
		s.counted++
	}
	s.setHead(u, p+1)
}

// unlink takes pair p (index + 1) out of u's list, prev being the pair
// before it (0: p is the first).
func (s *Users) unlink(u, prev, p uint32) {
	next := s.pairs[p-1].next
	if prev == 0 {
		s.setHead(u, next)
	} else {
		s.pairs[prev-1].next = next
	}
	s.pairs[p-1] = pair{}
	s.pfree = append(s.pfree, p-1)
}

// Stats returns what s holds. The caller holds its lock.
func (s *Users) Stats() UserStats {
	return UserStats{
		Members:     s.counted,
		DeviceRooms: len(s.pairs) - len(s.pfree),
		Bytes: int64(cap(s.heads))*4 + int64(cap(s.pairs))*int64(unsafe.Sizeof(pair{})) +
			int64(cap(s.pfree))*4 + int64(cap(s.scratch))*4,
	}
}
