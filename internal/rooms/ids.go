package rooms

import "unsafe"

// ids is a shard's byte arena of ids, each after a byte of its length.
// It is append-only, so a string into it never changes; compacting it
// makes a new one (fresh, move) and leaves the old to the collector.
type ids struct {
	b       []byte
	garbage int // bytes nothing refers to
}

// str returns the id at off.
func (a *ids) str(off uint32) string {
	n := int(a.b[off])
	if n == 0 {
		return ""
	}
	return unsafe.String(&a.b[off+1], n)
}

// full reports whether adding id would grow an arena that is more than
// half garbage: its owner compacts it first.
func (a *ids) full(id string) bool {
	return len(a.b)+1+len(id) > cap(a.b) && a.garbage > len(a.b)/2
}

// add appends id and returns its offset.
func (a *ids) add(id string) uint32 {
	if len(id) > 255 {
		panic("rooms: id longer than 255 bytes")
	}
	off := len(a.b)
	if off+1+len(id) > 1<<32-1 {
		panic("rooms: shard arena full")
	}
	a.b = append(a.b, byte(len(id)))
	a.b = append(a.b, id...)
	return uint32(off)
}

// drop counts the id at off as garbage.
func (a *ids) drop(off uint32) { a.garbage += 1 + int(a.b[off]) }

// fresh returns an empty arena with room for a's live ids and as many
// again.
func (a *ids) fresh() ids { return ids{b: make([]byte, 0, 2*(len(a.b)-a.garbage)+64)} }

// move copies the id at off of from into a and returns its new offset.
func (a *ids) move(from *ids, off uint32) uint32 {
	n := uint32(len(a.b))
	a.b = append(a.b, from.b[off:off+1+uint32(from.b[off])]...)
	return n
}
