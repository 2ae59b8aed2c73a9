package memstore

import (
	"hash/maphash"
	"unsafe"

	"github.com/presenced/presenced/internal/presence"
)

// The user table of a shard holds no pointers the collector must follow,
// however many users it holds: records (rec) sit in one slice of plain
// values, ids in a byte arena, and the index from id to record is an
// open-addressing table of integers. A map of a million strings to
// pointers was the collector's worst case (millions of objects to mark on
// every cycle, ~290 MB marked every few seconds while reads ran) and cost a
// read three dependent cache misses (map group, key, entry); a record here
// is found with two (slot, record), the id compared inside the record.
// What is rare and variable — a status text, devices beyond the first —
// lives in small maps beside the table.

// idHead is how many bytes of an id a record keeps inline: an id this long
// or shorter (a UUID's 36 characters included) is compared without touching
// the arena.
const idHead = 36

// span is a range of a shard's arena.
type span struct {
	off, n uint32
}

// rec is one user: presence.User without pointers. Operations inflate it
// into a presence.User, apply the state model's method and write it back.
// It is two cache lines (TestRecordSize), both of which a read touches.
type rec struct {
	idLen    uint8
	manual   presence.Manual
	pub      presence.Status
	flags    uint8
	settings presence.Settings
	ndev     uint16       // devices held; the first is dev, the rest in shard.more
	idHead   [idHead]byte // the first idHead bytes of the id
	idOff    uint32       // where the arena holds the whole id (idLen bytes)
	lastSeen int64
	version  uint64

	pubLastSeen int64
	sched       int64 // at of the heap item that is authoritative, 0 = none
	evictAt     int64 // when a user with no device may be dropped, 0 = not set
	dev         devRec
}

// id returns the span of the arena holding r's id.
func (r *rec) id() span { return span{off: r.idOff, n: uint32(r.idLen)} }

const (
	flagLive  = 1 << iota // the record holds a user (else it is on the free list)
	flagDirty             // in the shard's dirty list
	flagText              // shard.texts holds its text, published text or published version
	flagRooms             // a device of the user is in a room (Store.rooms)
)

// devRec is a presence.Device without pointers.
type devRec struct {
	id         span
	lastBeat   int64
	lastActive int64
	closed     int64
	owner      uint64
}

// lastBeatLow reads the second cache line of a record.
func (d *devRec) lastBeatLow() uint8 { return uint8(d.lastBeat) }

// texts are a user's status text and last published status text, and
// its published version where it is not the user's version (an invisible
// user who changed their text: presence.User's public face).
type texts struct {
	text, pub  string
	pubVersion uint64 // 0: the record's version
}

// table is the index and records of one shard. It is not safe for
// concurrent use: the shard's lock guards it.
type table struct {
	// slots is an open-addressing table with linear probing: each slot is
	// 0 (empty) or tag<<32 | (index of the record + 1), tag being the high
	// 32 bits of the id's hash. Its length is a power of two.
	slots []uint64
	n     int // users held
	recs  []rec
	free  []uint32 // indices of recs not live

	arena       []byte // ids; append-only, so a string into it never changes
	garbage     int    // bytes of the arena no record refers to
	compactions int

	texts map[uint32]texts             // users with a text (flagText)
	more  map[uint32][]presence.Device // devices beyond the first

	// scratch backs the Devices of the presence.User an operation
	// inflates, so no operation allocates or zeroes a device array.
	scratch []presence.Device

	seed  maphash.Seed // the store's
	shift uint         // the bits of a hash that chose the shard
}

// init readies an empty table of a store with the given seed, shardBits
// low bits of a hash choosing the shard, and a cap of maxDevices alive
// devices per user.
func (t *table) init(seed maphash.Seed, shardBits uint, maxDevices int) {
	t.seed, t.shift = seed, shardBits
	t.slots = make([]uint64, 8)
	t.texts = make(map[uint32]texts)
	t.more = make(map[uint32][]presence.Device)
	// One more than the cap: a new device joins before dead ones are dropped.
	t.scratch = make([]presence.Device, 0, maxDevices+1)
}

// pos is where the probe of hash h starts; tag is what its slots hold.
// The shard is chosen by h's low bits, the position by the bits above
// them and the tag by bits 32–63, so the three do not correlate while a
// shard holds fewer than 2^(32−shardBits) slots (2^24 with 256 shards).
func (t *table) pos(h uint64) int { return int(h>>t.shift) & (len(t.slots) - 1) }

func tag(h uint64) uint64 { return h &^ (1<<32 - 1) }

// find returns the index of id's record, or -1.
func (t *table) find(h uint64, id string) int {
	mask := len(t.slots) - 1
	tg := tag(h)
	for i := t.pos(h); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return -1
		}
		if s&^(1<<32-1) == tg {
			if idx := int(uint32(s)) - 1; t.is(&t.recs[idx], id) {
				return idx
			}
		}
	}
}

// is reports whether r is the record of id.
func (t *table) is(r *rec, id string) bool {
	if int(r.idLen) != len(id) {
		return false
	}
	if len(id) <= idHead {
		return string(r.idHead[:len(id)]) == id
	}
	return string(r.idHead[:]) == id[:idHead] && t.str(r.id())[idHead:] == id[idHead:]
}

// str returns the arena's bytes at sp as a string. The arena is
// append-only and replaced, never rewritten, when compacted, so the
// string stays what it is.
func (t *table) str(sp span) string {
	if sp.n == 0 {
		return ""
	}
	return unsafe.String(&t.arena[sp.off], int(sp.n))
}

// intern returns a span of the arena holding s: old itself if it holds s.
func (t *table) intern(old span, s string) span {
	if int(old.n) == len(s) && (len(s) == 0 || unsafe.StringData(s) == &t.arena[old.off] || t.str(old) == s) {
		return old
	}
	t.garbage += int(old.n)
	if len(s) == 0 {
		return span{}
	}
	if len(t.arena)+len(s) > cap(t.arena) && t.garbage > len(t.arena)/2 {
		t.compact()
	}
	sp := span{off: uint32(len(t.arena)), n: uint32(len(s))}
	t.arena = append(t.arena, s...)
	return sp
}

// compact copies what the records refer to into a new arena. The old one
// is left to the collector once no string refers to it.
func (t *table) compact() {
	live := len(t.arena) - t.garbage
	arena := make([]byte, 0, 2*live+64)
	move := func(sp span) span {
		if sp.n == 0 {
			return sp
		}
		n := span{off: uint32(len(arena)), n: sp.n}
		arena = append(arena, t.arena[sp.off:sp.off+sp.n]...)
		return n
	}
	for i := range t.recs {
		r := &t.recs[i]
		if r.flags&flagLive != 0 {
			r.idOff = move(r.id()).off
			r.dev.id = move(r.dev.id)
		}
	}
	t.arena, t.garbage = arena, 0
	t.compactions++
}

// add inserts a record for id, which must not be held, and returns its
// index. It may move the records: no *rec may be held across it.
func (t *table) add(h uint64, id string) int {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	var idx int
	if k := len(t.free); k > 0 {
		idx = int(t.free[k-1])
		t.free = t.free[:k-1]
	} else {
		idx = len(t.recs)
		t.recs = append(t.recs, rec{})
	}
	// Intern before the record is live: a compaction in intern moves the
	// ids of live records, and this one's is not in the arena yet.
	off := t.intern(span{}, id).off
	r := &t.recs[idx]
	*r = rec{flags: flagLive, idLen: uint8(len(id)), idOff: off}
	copy(r.idHead[:], id)
	t.place(h, idx)
	t.n++
	return idx
}

func (t *table) place(h uint64, idx int) {
	mask := len(t.slots) - 1
	i := t.pos(h)
	for t.slots[i] != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = tag(h) | uint64(idx+1)
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]uint64, 2*len(old))
	for _, s := range old {
		if s != 0 {
			idx := int(uint32(s)) - 1
			t.place(maphash.String(t.seed, t.str(t.recs[idx].id())), idx)
		}
	}
}

// remove drops the record idx of id (hash h), held.
func (t *table) remove(h uint64, idx int) {
	mask := len(t.slots) - 1
	i := t.pos(h)
	for int(uint32(t.slots[i]))-1 != idx {
		i = (i + 1) & mask
	}
	// Backward-shift deletion: move up every later slot of the run that
	// may sit at i, so a probe never meets a hole inside its run.
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		home := t.pos(maphash.String(t.seed, t.str(t.recs[int(uint32(t.slots[j]))-1].id())))
		// The slot at j may move to i if i lies cyclically in [home, j).
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
	r := &t.recs[idx]
	t.garbage += int(r.idLen) + int(r.dev.id.n)
	if r.flags&flagText != 0 {
		delete(t.texts, uint32(idx))
	}
	if r.ndev > 1 {
		delete(t.more, uint32(idx))
	}
	*r = rec{}
	t.free = append(t.free, uint32(idx))
	t.n--
}

// inflate returns record idx as a presence.User whose UserID is id. Its
// Devices are the table's scratch: valid until the next inflate.
func (t *table) inflate(idx int, id string) (presence.User, texts) {
	r := &t.recs[idx]
	var tx texts
	if r.flags&flagText != 0 {
		tx = t.texts[uint32(idx)]
	}
	devs := t.scratch[:0]
	if r.ndev > 0 {
		devs = append(devs, presence.Device{
			ID: t.str(r.dev.id), LastBeat: r.dev.lastBeat, LastActive: r.dev.lastActive,
			Closed: r.dev.closed, Owner: r.dev.owner,
		})
		if r.ndev > 1 {
			devs = append(devs, t.more[uint32(idx)]...)
		}
	}
	pv := tx.pubVersion
	if pv == 0 {
		pv = r.version
	}
	return presence.User{
		Profile: presence.Profile{
			UserID: id, Manual: r.manual, Text: tx.text,
			LastSeen: r.lastSeen, PubLastSeen: r.pubLastSeen,
			Version: r.version, Settings: r.settings,
			PubText: tx.pub, PubVersion: pv,
		},
		Devices: devs,
		Pub:     r.pub,
	}, tx
}

// store writes u back into record idx; tx is what inflate returned.
func (t *table) store(idx int, u *presence.User, tx texts) {
	r := &t.recs[idx]
	r.manual, r.pub, r.settings = u.Manual, u.Pub, u.Settings
	r.lastSeen, r.pubLastSeen, r.version = u.LastSeen, u.PubLastSeen, u.Version
	var pv uint64
	if u.PubVersion != u.Version {
		pv = u.PubVersion
	}
	if u.Text != tx.text || u.PubText != tx.pub || pv != tx.pubVersion {
		if u.Text == "" && u.PubText == "" && pv == 0 {
			delete(t.texts, uint32(idx))
			r.flags &^= flagText
		} else {
			t.texts[uint32(idx)] = texts{text: u.Text, pub: u.PubText, pubVersion: pv}
			r.flags |= flagText
		}
	}
	n := len(u.Devices)
	if n == 0 {
		t.garbage += int(r.dev.id.n)
		r.dev = devRec{}
	} else {
		d := &u.Devices[0]
		r.dev = devRec{
			id: t.intern(r.dev.id, d.ID), lastBeat: d.LastBeat, lastActive: d.LastActive,
			closed: d.Closed, owner: d.Owner,
		}
	}
	switch {
	case n > 1:
		more := t.more[uint32(idx)]
		more = append(more[:0], u.Devices[1:]...)
		t.more[uint32(idx)] = more
	case r.ndev > 1:
		delete(t.more, uint32(idx))
	}
	r.ndev = uint16(n)
}
