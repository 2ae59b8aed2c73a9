package rooms

import (
	"hash/maphash"
	"strings"
	"sync"
	"unsafe"

	"github.com/presenced/presenced/internal/presence"
)

// A room shard holds its rooms' records in one slice, their ids and their
// members' ids in a byte arena (each id after a byte of its length), and
// the index from room id to record as an open-addressing table of
// integers, as memstore's user table does.
//
// A room's members are sorted by their order key (orderHash(user), user)
// in chunks of at most chunkMax entries; an entry is
// orderHash(user)<<32 | offset of the user id in the arena. The room's
// directory lists its chunks in order, each as chunk ref<<32 | entries.
// A join or leave finds its chunk by binary search of the directory
// (comparing each chunk's first entry) and moves at most chunkMax entries;
// a full chunk splits in two, and a chunk that with a neighbour holds at
// most chunkMax/2 entries merges into it, so a room of n members has at
// most about 4n/chunkMax+1 chunks.

const (
	chunkClass = 6 // a chunk holds at most 1<<chunkClass members
	chunkMax   = 1 << chunkClass
)

// room is one room's record.
type room struct {
	idOff   uint32 // its id in the arena
	devs    uint32 // devices in the room, counted or not; 0: the record is free
	members uint32 // counted users with a device in the room
	nchunks uint32
	dir     uint32 // slab ref of its chunk directory (when nchunks > 0)
	_       uint32
	version uint64
}

type roomShard struct {
	mu sync.Mutex // guards the fields below

	// slots: 0 (empty) or tag<<32 | (index of the room + 1), tag being the
	// high 32 bits of the id's hash. Its length is a power of two.
	slots       []uint64
	n           int // rooms held (records in use)
	rooms       []room
	free        []uint32
	ids         ids // room and member ids
	compactions int
	compares    int // of member order keys, for a test of the cost of a page
	slab        slab
	floor       uint64 // the highest version of a room removed
	live        int    // rooms with a member
	members     int    // the sum of the rooms' members

	seed  maphash.Seed
	shift uint // the bits of a hash that chose the shard
	_     [64]byte
}

func (s *roomShard) init(seed maphash.Seed, shift uint) {
	s.seed, s.shift = seed, shift
	s.slots = make([]uint64, 8)
}

// str returns the id at off in the arena.
func (s *roomShard) str(off uint32) string { return s.ids.str(off) }

// intern appends id to the arena and returns its offset. It may compact
// the arena, moving the offsets every live room and member holds.
func (s *roomShard) intern(id string) uint32 {
	if s.ids.full(id) {
		s.compact()
	}
	return s.ids.add(id)
}

// compact copies what the rooms refer to into a new arena; the old one is
// left to the collector once no string refers to it.
func (s *roomShard) compact() {
	next := s.ids.fresh()
	move := func(off uint32) uint32 { return next.move(&s.ids, off) }
	for i := range s.rooms {
		r := &s.rooms[i]
		if r.devs == 0 {
			continue
		}
		r.idOff = move(r.idOff)
		if r.nchunks == 0 {
			continue
		}
		for _, d := range s.slab.block(r.dir)[:r.nchunks] {
			es := s.slab.block(uint32(d >> 32))[:uint32(d)]
			for j, e := range es {
				es[j] = e&^(1<<32-1) | uint64(move(uint32(e)))
			}
		}
	}
	s.ids = next
	s.compactions++
}

func (s *roomShard) pos(h uint64) int { return int(h>>s.shift) & (len(s.slots) - 1) }

// find returns the index of the room id (hash h), or -1.
func (s *roomShard) find(h uint64, id string) int {
	mask := len(s.slots) - 1
	tg := h &^ (1<<32 - 1)
	for i := s.pos(h); ; i = (i + 1) & mask {
		sl := s.slots[i]
		if sl == 0 {
			return -1
		}
		if sl&^(1<<32-1) == tg {
			if idx := int(uint32(sl)) - 1; s.str(s.rooms[idx].idOff) == id {
				return idx
			}
		}
	}
}

// add inserts an empty room id (hash h), not held, with its version at
// least base, and returns its index.
func (s *roomShard) add(h uint64, id string, base uint64) int {
	if (s.n+1)*4 > len(s.slots)*3 {
		s.grow()
	}
	var idx int
	if k := len(s.free); k > 0 {
		idx = int(s.free[k-1])
		s.free = s.free[:k-1]
	} else {
		idx = len(s.rooms)
		s.rooms = append(s.rooms, room{})
	}
	off := s.intern(id) // before the record is live: a compaction skips it
	s.rooms[idx] = room{idOff: off, version: max(base, s.floor)}
	s.place(h, idx)
	s.n++
	return idx
}

func (s *roomShard) place(h uint64, idx int) {
	mask := len(s.slots) - 1
	i := s.pos(h)
	for s.slots[i] != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = h&^(1<<32-1) | uint64(idx+1)
}

func (s *roomShard) grow() {
	old := s.slots
	s.slots = make([]uint64, 2*len(old))
	for _, sl := range old {
		if sl != 0 {
			idx := int(uint32(sl)) - 1
			s.place(maphash.String(s.seed, s.str(s.rooms[idx].idOff)), idx)
		}
	}
}

// remove drops room idx (hash h), which has no device left, raising the
// shard's floor to its version so a room of the same id made again
// never repeats one.
func (s *roomShard) remove(h uint64, idx int) {
	mask := len(s.slots) - 1
	i := s.pos(h)
	for int(uint32(s.slots[i]))-1 != idx {
		i = (i + 1) & mask
	}
	// Backward-shift deletion, as memstore's table does.
	for j := (i + 1) & mask; s.slots[j] != 0; j = (j + 1) & mask {
		home := s.pos(maphash.String(s.seed, s.str(s.rooms[int(uint32(s.slots[j]))-1].idOff)))
		if (j-home)&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = 0
	r := &s.rooms[idx]
	s.ids.drop(r.idOff)
	s.floor = max(s.floor, r.version)
	*r = room{}
	s.free = append(s.free, uint32(idx))
	s.n--
}

// cmp compares member entry e with the order key (h, id).
func (s *roomShard) cmp(e uint64, h uint32, id string) int {
	s.compares++
	if eh := uint32(e >> 32); eh != h {
		if eh < h {
			return -1
		}
		return 1
	}
	return strings.Compare(s.str(uint32(e)), id)
}

// chunkOf returns the index in dir of the chunk where key (h, id)
// belongs: the last whose first entry is at most the key, or 0.
func (s *roomShard) chunkOf(dir []uint64, h uint32, id string) int {
	lo, hi := 1, len(dir)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.cmp(s.slab.block(uint32(dir[m] >> 32))[0], h, id) > 0 {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo - 1
}

// search returns the first index of es whose entry is above the key (h,
// id), or at least it if !strict.
func (s *roomShard) search(es []uint64, h uint32, id string, strict bool) int {
	lo, hi := 0, len(es)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		c := s.cmp(es[m], h, id)
		if c > 0 || c == 0 && !strict {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

func chunkWord(ref uint32, n int) uint64 { return uint64(ref)<<32 | uint64(n) }

// dirInsert puts w at i of r's directory.
func (s *roomShard) dirInsert(r *room, i int, w uint64) {
	n := int(r.nchunks)
	if n == 1<<classOf(r.dir) {
		r.dir = s.slab.resize(r.dir, n, classOf(r.dir)+1)
	}
	d := s.slab.block(r.dir)
	copy(d[i+1:n+1], d[i:n])
	d[i] = w
	r.nchunks++
}

// dirRemove drops entry i of r's directory.
func (s *roomShard) dirRemove(r *room, i int) {
	n := int(r.nchunks)
	d := s.slab.block(r.dir)
	copy(d[i:n-1], d[i+1:n])
	r.nchunks--
	n--
	switch c := classOf(r.dir); {
	case n == 0:
		s.slab.release(r.dir)
	case c > 0 && n <= 1<<c/4:
		r.dir = s.slab.resize(r.dir, n, c-1)
	}
}

// insert adds the member entry e, of order key (h, id), which r does not
// hold. The arena must hold id already.
func (s *roomShard) insert(r *room, e uint64, h uint32, id string) {
	if r.nchunks == 0 {
		c := s.slab.alloc(0)
		s.slab.block(c)[0] = e
		r.dir = s.slab.alloc(0)
		s.slab.block(r.dir)[0] = chunkWord(c, 1)
		r.nchunks = 1
		return
	}
	ci := s.chunkOf(s.slab.block(r.dir)[:r.nchunks], h, id)
	d := s.slab.block(r.dir)[ci]
	c, n := uint32(d>>32), int(uint32(d))
	if n == 1<<classOf(c) {
		if classOf(c) < chunkClass {
			c = s.slab.resize(c, n, classOf(c)+1)
		} else {
			// Split: the upper half to a new chunk after c.
			nc := s.slab.alloc(chunkClass)
			half := n / 2
			copy(s.slab.block(nc), s.slab.block(c)[half:n])
			s.slab.block(r.dir)[ci] = chunkWord(c, half)
			s.dirInsert(r, ci+1, chunkWord(nc, n-half))
			if s.cmp(s.slab.block(nc)[0], h, id) < 0 {
				ci, c, n = ci+1, nc, n-half
			} else {
				n = half
			}
		}
	}
	es := s.slab.block(c)
	p := s.search(es[:n], h, id, true)
	copy(es[p+1:n+1], es[p:n])
	es[p] = e
	s.slab.block(r.dir)[ci] = chunkWord(c, n+1)
}

// delete removes the member of order key (h, id) from r and returns the
// arena offset of its id; ok is false when r does not hold it.
func (s *roomShard) delete(r *room, h uint32, id string) (off uint32, ok bool) {
	if r.nchunks == 0 {
		return 0, false
	}
	dir := s.slab.block(r.dir)[:r.nchunks]
	ci := s.chunkOf(dir, h, id)
	c, n := uint32(dir[ci]>>32), int(uint32(dir[ci]))
	es := s.slab.block(c)[:n]
	p := s.search(es, h, id, false)
	if p == n || s.cmp(es[p], h, id) != 0 {
		return 0, false
	}
	off = uint32(es[p])
	copy(es[p:], es[p+1:])
	n--
	if n == 0 {
		s.slab.release(c)
		s.dirRemove(r, ci)
		return off, true
	}
	dir[ci] = chunkWord(c, n)
	switch {
	case ci+1 < len(dir) && n+int(uint32(dir[ci+1])) <= chunkMax/2:
		s.merge(r, ci)
	case ci > 0 && n+int(uint32(dir[ci-1])) <= chunkMax/2:
		s.merge(r, ci-1)
	case classOf(c) > 0 && n <= 1<<classOf(c)/4:
		dir[ci] = chunkWord(s.slab.resize(c, n, classOf(c)-1), n)
	}
	return off, true
}

// merge moves chunk i+1 of r into chunk i.
func (s *roomShard) merge(r *room, i int) {
	dir := s.slab.block(r.dir)
	a, na := uint32(dir[i]>>32), int(uint32(dir[i]))
	b, nb := uint32(dir[i+1]>>32), int(uint32(dir[i+1]))
	if na+nb > 1<<classOf(a) {
		c := classOf(a)
		for na+nb > 1<<c {
			c++
		}
		a = s.slab.resize(a, na, c)
	}
	copy(s.slab.block(a)[na:], s.slab.block(b)[:nb])
	s.slab.release(b)
	s.slab.block(r.dir)[i] = chunkWord(a, na+nb)
	s.dirRemove(r, i+1)
}

// page appends up to limit members of r after the key of after ("" =
// from the first) and reports whether more follow.
func (s *roomShard) page(r *room, after string, limit int, out []string) ([]string, bool) {
	if r.nchunks == 0 {
		return out, false
	}
	dir := s.slab.block(r.dir)[:r.nchunks]
	ci, p := 0, 0
	if after != "" {
		h := orderHash(after)
		ci = s.chunkOf(dir, h, after)
		c, n := uint32(dir[ci]>>32), int(uint32(dir[ci]))
		p = s.search(s.slab.block(c)[:n], h, after, true)
	}
	for ; ci < len(dir); ci, p = ci+1, 0 {
		c, n := uint32(dir[ci]>>32), int(uint32(dir[ci]))
		for _, e := range s.slab.block(c)[p:n] {
			if limit <= 0 {
				return out, true
			}
			out = append(out, s.str(uint32(e)))
			limit--
		}
	}
	return out, false
}

func (s *roomShard) bytes() int64 {
	return int64(cap(s.slots))*8 + int64(cap(s.rooms))*int64(unsafe.Sizeof(room{})) +
		int64(cap(s.free))*4 + int64(cap(s.ids.b)) + s.slab.bytes()
}

// orderHash is the first part of a member's order key: a fixed hash, so
// the order is the same on every node and after a restart. Equal hashes
// fall back to comparing the ids, so a chosen collision costs nothing.
func orderHash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// join makes user a member of room ri and returns its count and version.
func (s *roomShard) join(ri int, user string) (int, uint64) {
	h := orderHash(user)
	off := s.intern(user)
	r := &s.rooms[ri]
	s.insert(r, uint64(h)<<32|uint64(off), h, user)
	if r.members == 0 {
		s.live++
		// An empty room reads as no room, whether invisible users'
		// devices keep its record or not: it is made again above the
		// shard's floor either way, so its version does not tell.
		r.version = max(r.version, s.floor)
	}
	r.members++
	s.members++
	r.version++
	return int(r.members), r.version
}

// leave ends user's membership of room ri and returns its count and
// version.
func (s *roomShard) leave(ri int, user string) (int, uint64) {
	r := &s.rooms[ri]
	off, ok := s.delete(r, orderHash(user), user)
	if !ok {
		panic("rooms: a member the room does not hold")
	}
	s.ids.drop(off)
	r.members--
	s.members--
	r.version++
	if r.members == 0 {
		s.live--
		s.floor = max(s.floor, r.version)
	}
	return int(r.members), r.version
}

// drop takes a device of user out of room ri: member says it was the
// user's last there and the user counts, so the user leaves. A room left
// without devices is removed.
func (s *roomShard) drop(ri int, user string, member bool, reason presence.RoomReason, now int64) (ev presence.RoomEvent, changed bool) {
	if member {
		n, v := s.leave(ri, user)
		ev = presence.RoomEvent{
			Room: s.str(s.rooms[ri].idOff), UserID: user, Kind: presence.RoomLeave, Reason: reason,
			Count: n, Version: v, At: now,
		}
		changed = true
	}
	r := &s.rooms[ri]
	if r.devs--; r.devs == 0 {
		s.remove(maphash.String(s.seed, s.str(r.idOff)), ri)
	}
	return ev, changed
}
