package ingest

import (
	"container/list"
	"time"
)

// devKey names one device of one user.
type devKey struct{ user, device string }

// byeEntry is what the memory knows of one device that disconnected.
type byeEntry struct {
	key     devKey
	bye     time.Time // latest session_disconnected `at` seen
	beat    time.Time // latest beat `at` applied after bye (zero: none)
	expires time.Time // node clock time after which the entry is useless
}

// byeMemory remembers, per device, the latest session_disconnected `at`
// this node applied, for a bounded time and a bounded number of devices,
// so that an older connect or heartbeat redelivered after it does not bring
// the device back. Entries are kept in a list ordered by expiry (every
// insert and update sets expiry to now+life and moves the entry to the
// back); the oldest is dropped when the memory is full.
//
// A byeMemory is used by one goroutine only (Run's); it is not safe for
// concurrent use.
type byeMemory struct {
	life  time.Duration
	max   int
	m     map[devKey]*list.Element // of *byeEntry
	order list.List                // front: expires first
}

func newByeMemory(life time.Duration, max int) *byeMemory {
	return &byeMemory{life: life, max: max, m: make(map[devKey]*list.Element)}
}

// expire drops the entries that expired by now.
func (b *byeMemory) expire(now time.Time) {
	for e := b.order.Front(); e != nil; e = b.order.Front() {
		be := e.Value.(*byeEntry)
		if be.expires.After(now) {
			return
		}
		b.order.Remove(e)
		delete(b.m, be.key)
	}
}

// beatAllowed reports whether a beat of k at `at` may be applied, that is
// whether no disconnect of k at or after `at` is remembered. When it is
// allowed and k disconnected before, the beat is remembered too, so that
// the older disconnect, if redelivered, does not end the reconnected
// device.
func (b *byeMemory) beatAllowed(k devKey, at, now time.Time) bool {
	b.expire(now)
	e, ok := b.m[k]
	if !ok {
		return true
	}
	be := e.Value.(*byeEntry)
	if !at.After(be.bye) {
		return false
	}
	if at.After(be.beat) {
		be.beat = at
		be.expires = now.Add(b.life)
		b.order.MoveToBack(e)
	}
	return true
}

// byeAllowed reports whether a disconnect of k at `at` may be applied: not
// when a beat after it (a reconnect) is remembered.
func (b *byeMemory) byeAllowed(k devKey, at, now time.Time) bool {
	b.expire(now)
	e, ok := b.m[k]
	if !ok {
		return true
	}
	return !e.Value.(*byeEntry).beat.After(at)
}

// recordBye remembers a disconnect of k at `at` that was applied.
func (b *byeMemory) recordBye(k devKey, at, now time.Time) {
	b.expire(now)
	if e, ok := b.m[k]; ok {
		be := e.Value.(*byeEntry)
		if at.After(be.bye) {
			be.bye = at
		}
		be.expires = now.Add(b.life)
		b.order.MoveToBack(e)
		return
	}
	for len(b.m) >= b.max {
		front := b.order.Front()
		b.order.Remove(front)
		delete(b.m, front.Value.(*byeEntry).key)
	}
	b.m[k] = b.order.PushBack(&byeEntry{key: k, bye: at, expires: now.Add(b.life)})
}

// len returns the number of devices remembered.
func (b *byeMemory) len() int { return len(b.m) }
