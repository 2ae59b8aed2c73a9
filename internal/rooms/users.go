package rooms

import (
	"sync"
	"unsafe"
)

// A user shard holds, for each user with a device in a room, a record
// (found by its UserRef in an open-addressing table of integers) and a
// list of its (device, room) pairs in one slice of plain values; ids sit
// in a byte arena after a byte of their length, and every pair of one
// device refers to the same copy of its id.

// user is one user with a device in some room.
type user struct {
	ref     UserRef
	idOff   uint32 // its id in the arena
	head    uint32 // its first pair + 1
	npairs  uint32
	counted bool
	live    bool
}

// pair is one device of a user in one room.
type pair struct {
	next uint32 // the user's next pair + 1, 0: the last
	room uint32 // the room's ref: its index<<shard bits | its shard
	dev  uint32 // the device's id in the arena
}

type userShard struct {
	mu sync.Mutex // guards the fields below

	// slots: 0 (empty) or ref<<32 | (index of the record + 1). Its length
	// is a power of two.
	slots       []uint64
	n           int // records held
	counted     int // records of counted users
	recs        []user
	free        []uint32
	pairs       []pair
	pfree       []uint32
	ids         ids // user and device ids
	compactions int

	scratch []uint32 // rooms, for SetCounted and LeaveAll
	old     []uint32 // offsets, for compact and Devices

	shift uint // the bits of a hash that chose the shard
	_     [64]byte
}

func (s *userShard) init(shift uint) {
	s.shift = shift
	s.slots = make([]uint64, 8)
}

// refHash mixes a UserRef (splitmix64's finaliser): its low bits choose
// the shard, the bits above them the slot.
func refHash(u UserRef) uint64 {
	x := uint64(u) + 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func (s *userShard) pos(u UserRef) int {
	return int(refHash(u)>>s.shift) & (len(s.slots) - 1)
}

func (s *userShard) str(off uint32) string { return s.ids.str(off) }

// intern appends id to the arena and returns its offset; it may compact
// the arena, moving the offsets of live records and their pairs.
func (s *userShard) intern(id string) uint32 {
	if s.ids.full(id) {
		s.compact()
	}
	return s.ids.add(id)
}

func (s *userShard) compact() {
	next := s.ids.fresh()
	move := func(off uint32) uint32 { return next.move(&s.ids, off) }
	for i := range s.recs {
		r := &s.recs[i]
		if !r.live {
			continue
		}
		r.idOff = move(r.idOff)
		// The pairs of one device share one copy: old holds old, new
		// offset by twos.
		s.old = s.old[:0]
	pairs:
		for p := r.head; p != 0; p = s.pairs[p-1].next {
			pr := &s.pairs[p-1]
			for k := 0; k < len(s.old); k += 2 {
				if s.old[k] == pr.dev {
					pr.dev = s.old[k+1]
					continue pairs
				}
			}
			n := move(pr.dev)
			s.old = append(s.old, pr.dev, n)
			pr.dev = n
		}
	}
	s.ids = next
	s.compactions++
}

// find returns the index of u's record, or -1.
func (s *userShard) find(u UserRef) int {
	mask := len(s.slots) - 1
	for i := s.pos(u); ; i = (i + 1) & mask {
		sl := s.slots[i]
		if sl == 0 {
			return -1
		}
		if UserRef(sl>>32) == u {
			return int(uint32(sl)) - 1
		}
	}
}

// add makes a record of u (not held) and returns its index.
func (s *userShard) add(u UserRef, id string, counted bool) int {
	if (s.n+1)*4 > len(s.slots)*3 {
		old := s.slots
		s.slots = make([]uint64, 2*len(old))
		for _, sl := range old {
			if sl != 0 {
				s.place(sl)
			}
		}
	}
	var idx int
	if k := len(s.free); k > 0 {
		idx = int(s.free[k-1])
		s.free = s.free[:k-1]
	} else {
		idx = len(s.recs)
		s.recs = append(s.recs, user{})
	}
	off := s.intern(id) // before the record is live: a compaction skips it
	s.recs[idx] = user{ref: u, idOff: off, counted: counted, live: true}
	s.place(uint64(u)<<32 | uint64(idx+1))
	s.n++
	if counted {
		s.counted++
	}
	return idx
}

func (s *userShard) place(sl uint64) {
	mask := len(s.slots) - 1
	i := s.pos(UserRef(sl >> 32))
	for s.slots[i] != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = sl
}

// remove drops record idx, which has no pair left.
func (s *userShard) remove(idx int) {
	r := &s.recs[idx]
	mask := len(s.slots) - 1
	i := s.pos(r.ref)
	for int(uint32(s.slots[i]))-1 != idx {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; s.slots[j] != 0; j = (j + 1) & mask {
		home := s.pos(UserRef(s.slots[j] >> 32))
		if (j-home)&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = 0
	s.ids.drop(r.idOff)
	if r.counted {
		s.counted--
	}
	*r = user{}
	s.free = append(s.free, uint32(idx))
	s.n--
}

// addPair puts a pair at the head of record idx's list.
func (s *userShard) addPair(idx int, room, dev uint32) {
	var p uint32
	if k := len(s.pfree); k > 0 {
		p = s.pfree[k-1]
		s.pfree = s.pfree[:k-1]
	} else {
		p = uint32(len(s.pairs))
		s.pairs = append(s.pairs, pair{})
	}
	r := &s.recs[idx]
	s.pairs[p] = pair{next: r.head, room: room, dev: dev}
	r.head = p + 1
	r.npairs++
}

// unlink takes pair p (index + 1) out of record idx's list, prev being
// the pair before it (0: p is the head). devShared says whether another
// pair of the user refers to p's device id; if not, the id is garbage.
func (s *userShard) unlink(idx int, prev, p uint32, devShared bool) {
	r := &s.recs[idx]
	pr := s.pairs[p-1]
	if prev == 0 {
		r.head = pr.next
	} else {
		s.pairs[prev-1].next = pr.next
	}
	if !devShared {
		s.ids.drop(pr.dev)
	}
	s.pairs[p-1] = pair{}
	s.pfree = append(s.pfree, p-1)
	r.npairs--
}

func (s *userShard) bytes() int64 {
	return int64(cap(s.slots))*8 + int64(cap(s.recs))*int64(unsafe.Sizeof(user{})) +
		int64(cap(s.free))*4 + int64(cap(s.pairs))*int64(unsafe.Sizeof(pair{})) +
		int64(cap(s.pfree))*4 + int64(cap(s.ids.b)) + int64(cap(s.scratch)+cap(s.old))*4
}
